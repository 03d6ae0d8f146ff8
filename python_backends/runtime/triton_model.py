"""The adapter between Triton's python backend and a `Step`.

A generated `model.py` is two lines: import the step class, `TritonPythonModel = triton_model(Cls)`.
Everything Triton-specific lives here: config parsing, device placement, reading inputs (numpy for
CPU tensors, torch via DLPack for GPU tensors), building responses, and turning exceptions into
per-request Triton errors so that one bad request never fails the others in its batch.
"""
from __future__ import annotations

import gc
import json
import threading
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from triton_omni.runtime import metrics, warmup
from triton_omni.runtime.errors import InvalidInput, error_code, error_message, forget_traceback, to_triton_error
from triton_omni.runtime.guards import InputGuard
from triton_omni.runtime.params import parse_params
from triton_omni.runtime.step import Request, ResponseSink, Step, StepContext


# One lock around every call into the stub from any of a model's threads. The 2.51 python stub is
# not safe to enter from several Python threads at once: under load it corrupted its interpreter
# (segfaults in libpython, "Reference count error ... dtype 17 (O)"). Waiting (for a BLS response,
# for the engine) happens outside it. Reentrant: a step may send while submitting.
STUB_LOCK = threading.RLock()


def _to_triton_tensor(pb_utils, name: str, value: Any):
    if isinstance(value, np.ndarray):
        return pb_utils.Tensor(name, value)
    import torch  # only steps that produce torch tensors pay for the import

    if isinstance(value, torch.Tensor):
        return pb_utils.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(value.contiguous()))
    raise TypeError(f"output {name!r}: expected numpy array or torch tensor, got {type(value).__name__}")


class _TritonSink(ResponseSink):
    """Sends one request's streamed responses; safe to call from the step's own threads."""

    def __init__(self, adapter: "_Adapter", request):
        self.adapter = adapter
        self.sender = request.get_response_sender()   # outlives the request; the request does not
        self.wanted = set(request.requested_output_names())
        self.done = False
        self.lock = STUB_LOCK

    def send(self, outputs: dict[str, Any], final: bool = False) -> None:
        pb = self.adapter.pb_utils
        with self.lock:
            if self.done:
                return
            self.done = final
            response = pb.InferenceResponse(output_tensors=self.adapter.output_tensors(outputs, self.wanted))
            self.sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def error(self, exc: BaseException) -> None:
        pb = self.adapter.pb_utils
        with self.lock:
            if self.done:
                return
            self.done = True
            self.adapter.errors.inc(error_code(exc))
            self.sender.send(pb.InferenceResponse(error=to_triton_error(exc, pb)),
                             flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def is_cancelled(self) -> bool:
        # Under the lock: asking Triton about a request whose final response went out crashes the
        # server (its response factory is gone), so a finished sink never asks.
        with self.lock:
            if self.done:
                return False
            try:
                return self.sender.is_cancelled()
            except Exception:  # noqa: BLE001 - a closed stream counts as cancelled
                return True


class _Adapter:
    step_cls: type[Step]

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb_utils = pb_utils
        config = json.loads(args["model_config"])
        self.batched = int(config.get("max_batch_size", 0)) > 0
        # upper-case keys are python-backend settings (FORCE_CPU_ONLY_INPUT_TENSORS), not step parameters
        raw = {k: v["string_value"] for k, v in config.get("parameters", {}).items() if not k.isupper()}
        warmup_spec = warmup.WarmupSpec.parse(raw.pop(warmup.PARAMETER, ""))
        params = parse_params(self.step_cls.Params, raw)
        gpu = args.get("model_instance_kind") == "GPU"
        device = f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu"
        ctx = StepContext(model_name=args["model_name"], params=params, device=device,
                          base_dir=Path(args["model_repository"]).resolve().parent.parent,
                          max_batch_size=int(config.get("max_batch_size", 0)),
                          log=pb_utils.Logger.log_info)
        self.input_names = [t.name for t in self.step_cls.inputs]
        self.step = self.step_cls(ctx)
        self.guard = InputGuard(self.step_cls.inputs, self.step.input_limits())
        self.warm(warmup_spec, ctx)
        # Triton's own warmup requests (model_warmup, written by the converter) arrive before any other
        self.triton_warmups = sum(max(1, int(w.get("count", 1) or 1)) for w in config.get("model_warmup", []))
        self.warmup_spec = warmup_spec
        name = args["model_name"]
        self.requests = metrics.Counter("triton_omni_requests_total", "requests a step received", name)
        self.errors = metrics.CounterByLabel("triton_omni_request_errors_total",
                                             "requests a step answered with an error, by Triton error code",
                                             name, "code")

    def warm(self, spec: warmup.WarmupSpec, ctx: StepContext) -> None:
        """This instance's warmup (runtime/warmup.py), before Triton calls the model ready. A failed
        warmup is logged, not fatal: the model still serves, only its first requests pay the first-call costs."""
        try:
            wanted = {t.name for t in self.step_cls.outputs}

            def respond(outputs):           # built as a response would be, not sent
                with STUB_LOCK:
                    self.pb_utils.InferenceResponse(output_tensors=self.output_tensors(outputs, wanted))
            with metrics.paused():
                done = warmup.run(self.step, spec, ctx.max_batch_size, respond)
            self.pb_utils.Logger.log_info(f"{ctx.model_name}: warmup: {done}")
        except Exception as exc:  # noqa: BLE001
            self.pb_utils.Logger.log_error(f"{ctx.model_name}: warmup failed, serving unwarmed: "
                                           + error_message(exc, internal=True))

    # -- tensors ------------------------------------------------------------------------------
    def read_request(self, request) -> Request:
        pb = self.pb_utils
        tensors = {}
        for name in self.input_names:
            t = pb.get_input_tensor_by_name(request, name)
            if t is None:
                continue
            if t.is_cpu():
                # a decoupled step keeps using inputs after execute returns, when Triton has
                # released the request's memory: give it its own copy
                value = t.as_numpy().copy() if self.step_cls.decoupled else t.as_numpy()
            else:
                import torch

                value = torch.utils.dlpack.from_dlpack(t.to_dlpack())
                value = value.clone() if self.step_cls.decoupled else value
            if self.batched:
                if value.shape[0] != 1:
                    raise InvalidInput(name, f"batch dimension is {value.shape[0]}; send one item per "
                                             "request (the server batches requests together)")
                value = value[0]
            tensors[name] = value
        self.guard.check(tensors)
        # a decoupled step asks its sink (the response sender outlives the request) instead
        return Request(tensors, request.request_id(), None if self.step_cls.decoupled else request.is_cancelled)

    def output_tensors(self, outputs: dict[str, Any], wanted: set[str]) -> list:
        """The requested outputs only. The 2.51 stub drops unrequested ones itself, but a decoupled
        send does that with the GIL released: a BYTES tensor dropped there frees its serialized
        numpy buffer without the GIL while the step's other threads run Python."""
        return [_to_triton_tensor(self.pb_utils, name, value[None] if self.batched else value)
                for name, value in outputs.items() if name in wanted]

    # -- execution ----------------------------------------------------------------------------
    def execute(self, requests):
        if self.triton_warmups > 0 and not self.step_cls.decoupled:
            self.triton_warmups -= len(requests)
            return self._answer_warmup(requests)
        self.requests.inc(len(requests))
        try:
            return self._execute(requests)
        finally:
            metrics.flush()

    def _execute(self, requests):
        if self.step_cls.decoupled:
            with STUB_LOCK:                 # the step's own threads send responses meanwhile
                for r in requests:
                    sink = _TritonSink(self, r)
                    try:
                        self.step.submit(self.read_request(r), sink)
                    except Exception as exc:  # noqa: BLE001 - becomes this request's error
                        self._log_unexpected(exc)
                        sink.error(exc)
            return None

        pb = self.pb_utils
        parsed: list[Request | BaseException] = []
        for r in requests:
            try:
                parsed.append(self.read_request(r))
            except Exception as exc:  # noqa: BLE001
                parsed.append(exc)
        good = [p for p in parsed if isinstance(p, Request)]
        try:
            results = iter(self.step.execute(good) if good else [])
        except Exception as exc:  # noqa: BLE001 - the whole batch failed
            self._log_unexpected(exc)
            results = iter([exc] * len(good))
        responses = []
        for r, p in zip(requests, parsed):
            result = p if isinstance(p, BaseException) else next(results)
            if isinstance(result, BaseException):
                self._log_unexpected(result)
                forget_traceback(result)
                self.errors.inc(error_code(result))
                responses.append(pb.InferenceResponse(error=to_triton_error(result, pb)))
            else:
                try:
                    wanted = set(r.requested_output_names())
                    responses.append(pb.InferenceResponse(output_tensors=self.output_tensors(result, wanted)))
                except Exception as exc:  # noqa: BLE001
                    self._log_unexpected(exc)
                    self.errors.inc(error_code(exc))
                    responses.append(pb.InferenceResponse(error=to_triton_error(exc, pb)))
        return responses

    def _answer_warmup(self, requests) -> list:
        """Triton's warmup requests (zeros): each answered with the step's result on its own warmup sample,
        so the way out (tensors, response) is warmed too. Never an error: that would fail the model's load."""
        pb = self.pb_utils
        samples = warmup.samples_of(self.step, self.warmup_spec)
        responses = []
        for r in requests:
            outputs = {}
            if samples:
                try:
                    with metrics.paused():
                        result = self.step.execute([warmup.request(samples[0])])[0]
                    outputs = {} if isinstance(result, BaseException) else result
                except Exception as exc:  # noqa: BLE001
                    pb.Logger.log_error(f"{self.step_cls.step_name}: warmup request failed: {error_message(exc, True)}")
            responses.append(pb.InferenceResponse(output_tensors=self.output_tensors(outputs,
                                                                                    set(r.requested_output_names()))))
        return responses

    def _log_unexpected(self, exc: BaseException) -> None:
        if not isinstance(exc, InvalidInput):
            # the traceback, then the message capped as the client sees it (a huge input stays out of the log)
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[:-1])
            self.pb_utils.Logger.log_error(trace + error_message(exc, internal=True))

    def finalize(self) -> None:
        self.step.close()
        # Free what the step's reference cycles hold (response senders, metric families, requests)
        # now, while the stub can still release them. Left to the collection at interpreter exit,
        # after the stub has unmapped its shared memory, each crashed the stub (SIGSEGV).
        self.step = None
        self.requests = self.errors = None
        metrics.close()
        gc.collect()


def triton_model(step_cls: type[Step]) -> type:
    """The `TritonPythonModel` class for a step."""
    return type("TritonPythonModel", (_Adapter,), {"step_cls": step_cls})
