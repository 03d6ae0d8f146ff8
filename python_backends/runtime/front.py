"""The front of a streaming ensemble: relays requests to it and makes cancellation work.

Triton 2.51 checks an ensemble request for cancellation only between steps, so a long-running
decoupled step (an AR decode) never learns that its client cancelled or went away, and keeps its
batch slot until max_tokens. The front is the model clients call: it forwards each request to the
ensemble (BLS, same inputs, a unique request id that the ensemble hands to every step), relays every
response, and when the client cancels it asks each streaming step to abort that request id.
A streaming step ends an aborted request with a normal final response (finish_reason
"cancelled"): an error in the middle of a stream does not reach a BLS caller in Triton 2.51.

Progress: a streaming step that takes `progress_request_id` (a video model's denoise loop) reports
a request's progress to a second request, its watcher, while the request itself goes on through the
ensemble. The front opens that watch beside each relayed request (BLS, decoupled) and passes its
responses on to the client, then the ensemble's answer: the watched step has finished its part (its
watch stream has ended) before any later step answers.
"""
from __future__ import annotations

import json
import threading
import time
import uuid

import numpy as np

from triton_omni.runtime.triton_model import STUB_LOCK   # every call into the stub holds it

CANCEL_CHECK_S = 0.1
CHECKS_PER_ROUND = 8
ABORT_INPUT = "abort_request_id"
PROGRESS_INPUT = "progress_request_id"
WATCH_JOIN_S = 60.0      # how long an answer waits for its progress streams to end (they end first)


class _Stream:
    """One client stream; sends and cancellation checks go through STUB_LOCK, which also orders
    them: asking Triton about a request whose final response is out crashes the server."""

    def __init__(self, sender, pb):
        self.sender, self.pb = sender, pb
        self.lock = STUB_LOCK
        self.finished = False
        self.cancelled = False
        self.last_checked = 0.0

    def send(self, response) -> None:
        with self.lock:
            if not (self.finished or self.cancelled):
                self.sender.send(response)

    def finish(self, response=None) -> None:
        with self.lock:
            if self.finished:
                return
            self.finished = True
            try:
                if response is not None and not self.cancelled:
                    self.sender.send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    self.sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:  # noqa: BLE001 - the client is gone
                pass

    def check_cancelled(self) -> bool:
        """True once, when the client has cancelled (then the relay stops forwarding)."""
        with self.lock:
            self.last_checked = time.monotonic()
            if self.finished or self.cancelled:
                return False
            try:
                self.cancelled = self.sender.is_cancelled()
            except Exception:  # noqa: BLE001
                self.cancelled = True
            return self.cancelled


class StreamFront:
    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.ensemble = params["ensemble"]
        self.abort_models = [m for m in params.get("abort_models", "").split(",") if m]
        self.progress_models = [m for m in params.get("progress_models", "").split(",") if m]
        self.progress_outputs = [o for o in params.get("progress_outputs", "").split(",") if o]
        self.output_names = [o["name"] for o in config["output"] if o["name"] not in self.progress_outputs]
        self.batched = int(config.get("max_batch_size", 0)) > 0
        # an unbatched front (max_batch_size 0: inputs of shape [1], as Triton's vLLM backend's
        # clients send) before a batched ensemble: a batch dimension added to inputs, removed from outputs
        self.reshape = not self.batched and params.get("ensemble_batched") == "true"
        self.steps_batched = self.batched or self.reshape
        self.active: dict[str, _Stream] = {}   # inner request id -> the client's stream
        # Triton's own warmup requests (model_warmup, written by the converter) come first: answered here
        self.warmups = sum(max(1, int(w.get("count", 1) or 1)) for w in config.get("model_warmup", []))
        self.lock = threading.Lock()
        self._stop = False
        self.watcher = threading.Thread(target=self._watch, name="front-cancel", daemon=True)
        self.watcher.start()
        self._warm_bls()

    def _answer_warmup(self, requests) -> None:
        """Triton's warmup requests, before the model is ready: the way in (inputs copied, a response
        sender, a relay thread) and out (a response sent) without the ensemble, which may still be loading."""
        for request in requests:
            with STUB_LOCK:
                [self.pb.Tensor(t.name(), t.as_numpy().copy()) for t in request.inputs()]
                stream = _Stream(request.get_response_sender(), self.pb)
            relay = threading.Thread(target=stream.finish, args=(self.pb.InferenceResponse(output_tensors=[]),),
                                     name="front-warmup", daemon=True)
            relay.start()
            relay.join()
        return None

    def _warm_bls(self) -> None:
        """One decoupled BLS call before the model is ready, so the first client's relay does not pay
        for setting up the stub's BLS path (~30-45 ms on a CPU). The ensemble may not be loaded yet, so
        the call goes to a model that does not exist and its error is the expected answer."""
        pb = self.pb
        try:
            with STUB_LOCK:
                req = pb.InferenceRequest(model_name=f"{self.ensemble}__warmup_no_such_model",
                                          inputs=[pb.Tensor("x", np.zeros([1], np.int32))], requested_output_names=[])
            for _ in req.exec(decoupled=True):
                pass
        except Exception:  # noqa: BLE001 - an error is the expected answer
            pass

    def execute(self, requests):
        if self.warmups > 0:
            self.warmups -= len(requests)
            return self._answer_warmup(requests)
        for request in requests:
            # The request is released when execute returns: copy its inputs now, keep only the
            # sender. A daemon thread per stream: a relay waiting on the ensemble never holds up
            # shutdown.
            with STUB_LOCK:
                if self.reshape:
                    inputs = [self.pb.Tensor(t.name(), t.as_numpy()[None].copy()) for t in request.inputs()]
                    inputs += self._parameters_as_input(request, {t.name() for t in request.inputs()})
                else:
                    inputs = [self.pb.Tensor(t.name(), t.as_numpy().copy()) for t in request.inputs()]
                sender = request.get_response_sender()
                wanted = set(request.requested_output_names())
            threading.Thread(target=self._relay, args=(inputs, sender, wanted),
                             name="front-relay", daemon=True).start()
        return None

    def _relay(self, inputs: list, sender, wanted: set[str]) -> None:
        pb = self.pb
        inner_id = uuid.uuid4().hex
        stream = _Stream(sender, pb)
        with self.lock:
            self.active[inner_id] = stream
        try:
            # the relay only forwards bytes: keep the ensemble's outputs in CPU memory (on a GPU
            # server they could otherwise come back through the limited CUDA memory pool)
            with STUB_LOCK:
                bls = pb.InferenceRequest(model_name=self.ensemble, inputs=inputs,
                                          requested_output_names=self.output_names, request_id=inner_id,
                                          preferred_memory=pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0))
            watched = [o for o in self.progress_outputs if o in wanted]
            watches = [self._watch_progress(model, inner_id, stream, watched)
                       for model in (self.progress_models if watched else [])]
            # Not under the lock: a decoupled exec returns only with the request's first response, and
            # that may wait for a batch slot which only the cancellation checks (under the lock) free.
            responses = bls.exec(decoupled=True)
            for response in responses:                 # waits outside the lock
                with STUB_LOCK:
                    error = response.error() if response.has_error() else None
                    # only what the client asked for: the stub would drop the rest itself, inside
                    # send, without the GIL (see triton_model.py's output_tensors)
                    tensors = None if error else [t for t in response.output_tensors() if t.name() in wanted]
                    if tensors and self.reshape:
                        tensors = [pb.Tensor(t.name(), t.as_numpy()[0]) for t in tensors]
                if error is not None:
                    stream.finish(pb.InferenceResponse(error=error))
                    if watches:
                        self._abort([inner_id])        # a watch still waiting for its request ends
                    return
                if tensors:
                    for watch in watches:              # their progress goes out before the answer
                        watch.join(WATCH_JOIN_S)
                    watches = []
                    stream.send(pb.InferenceResponse(output_tensors=tensors))
            stream.finish()
        except Exception as exc:  # noqa: BLE001 - this request fails, the model keeps serving
            pb.Logger.log_error(f"{self.ensemble}: relay failed: {exc!r}")
            stream.finish(pb.InferenceResponse(error=pb.TritonError(f"relay failed: {exc}")))
        finally:
            with self.lock:
                self.active.pop(inner_id, None)

    def _watch_progress(self, model: str, inner_id: str, stream: _Stream, outputs: list[str]) -> threading.Thread:
        """Relay `model`'s progress reports on request `inner_id` to the client's stream, in a thread of
        their own, until the step ends the watch (when it is done with the request, or aborts it)."""
        pb = self.pb

        def relay() -> None:
            try:
                value = np.array([[inner_id.encode()]] if self.steps_batched else [inner_id.encode()], dtype=np.object_)
                with STUB_LOCK:
                    req = pb.InferenceRequest(model_name=model, inputs=[pb.Tensor(PROGRESS_INPUT, value)],
                                              requested_output_names=outputs, request_id=f"watch-{inner_id}")
                for response in req.exec(decoupled=True):       # waits outside the lock
                    with STUB_LOCK:
                        tensors = [] if response.has_error() else response.output_tensors()
                        if tensors and self.reshape:
                            tensors = [pb.Tensor(t.name(), t.as_numpy()[0]) for t in tensors]
                    if tensors:
                        stream.send(pb.InferenceResponse(output_tensors=tensors))
            except Exception as exc:  # noqa: BLE001 - the request goes on without progress
                pb.Logger.log_error(f"{self.ensemble}: progress watch on {model} failed: {exc!r}")

        thread = threading.Thread(target=relay, name="front-progress", daemon=True)
        thread.start()
        return thread

    def _watch(self) -> None:
        while not self._stop:
            time.sleep(CANCEL_CHECK_S)
            with self.lock:       # a few streams per round: each question is a round trip
                items = sorted(self.active.items(), key=lambda kv: kv[1].last_checked)[:CHECKS_PER_ROUND]
            cancelled = [inner_id for inner_id, stream in items if stream.check_cancelled()]
            if cancelled:
                self._abort(cancelled)

    def _abort(self, inner_ids: list[str]) -> None:
        """One abort request per streaming step for all of a round's cancelled streams (ids joined by
        ","): each request is a round trip made under the stub lock, which every relay waits for."""
        pb = self.pb
        joined = ",".join(inner_ids).encode()
        value = np.array([[joined]] if self.steps_batched else [joined], dtype=np.object_)
        for model in self.abort_models:
            try:
                with STUB_LOCK:
                    req = pb.InferenceRequest(model_name=model, inputs=[pb.Tensor(ABORT_INPUT, value)],
                                              requested_output_names=[], request_id=f"abort-{inner_ids[0]}")
                    replies = req.exec(decoupled=True)
                for _ in replies:
                    pass
            except Exception as exc:  # noqa: BLE001
                pb.Logger.log_error(f"{self.ensemble}: abort of {inner_ids} in {model} failed: {exc!r}")

    def _parameters_as_input(self, request, present: set[str]) -> list:
        """Triton's vLLM backend reads its sampling parameters from the request's parameters when no
        `sampling_parameters` tensor comes (its sample client sends both): the same here, as the tensor."""
        if "sampling_parameters" in present:
            return []
        params = request.parameters()
        if not params or params in ("{}", b"{}"):
            return []
        text = params.decode() if isinstance(params, bytes) else str(params)
        return [self.pb.Tensor("sampling_parameters", np.array([[text.encode()]], dtype=np.object_))]

    def finalize(self) -> None:
        self._stop = True
