"""The proxy's side of Triton: which models are ready, their configs, and one request's responses in asyncio.

Each request gets its own gRPC stream (tritonclient's sync client; its callback thread hands
responses to the event loop). The stream ends on Triton's final-response flag. When the HTTP client
goes away (checked while waiting) or the handler stops iterating, the stream is closed with
`cancel_requests=True`: Triton cancels the request and the model's front aborts its decode, so
nothing keeps running for a client that left.

Every call to Triton has a deadline: the control calls CONTROL_TIMEOUT_S, a request's stream
`timeout_s` (504 past it, checked while responses keep coming too; the gRPC stream itself has a
deadline a little later, in case the proxy's loop is what stalls).
"""
from __future__ import annotations

import asyncio
import threading
import uuid
from typing import AsyncIterator, Awaitable, Callable

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from triton_omni.client.openai_proxy.errors import ProxyError, from_triton
from triton_omni.client.tensors import make_inputs
from triton_omni.client.triton import host_port, is_final_response

Outputs = dict[str, np.ndarray]
POLL_S = 0.2            # how often a waiting request checks that its client is still there
CONTROL_TIMEOUT_S = 10  # model index, model config, liveness
STREAM_GRACE_S = 5      # the gRPC stream's own deadline: this much after the proxy's


class ClientGone(Exception):
    """The HTTP client disconnected; its Triton request was cancelled."""


class TritonGateway:
    def __init__(self, url: str, timeout_s: float = 600.0):
        self.url = host_port(url)
        self.timeout_s = timeout_s
        self._control = grpcclient.InferenceServerClient(self.url)
        self._lock = threading.Lock()

    async def _call(self, fn, *args, **kwargs):
        def run():
            with self._lock:
                return fn(*args, **kwargs)
        try:
            return await asyncio.to_thread(run)
        except InferenceServerException as e:
            raise from_triton(e) from None

    async def ready_models(self) -> set[str]:
        index = await self._call(self._control.get_model_repository_index, as_json=True,
                                 client_timeout=CONTROL_TIMEOUT_S)
        return {m["name"] for m in index.get("models", []) if m.get("state") == "READY"}

    async def model_config(self, name: str) -> dict:
        """A model's config.pbtxt as Triton's JSON (its `parameters` say which OpenAI route it serves)."""
        config = await self._call(self._control.get_model_config, name, as_json=True,
                                  client_timeout=CONTROL_TIMEOUT_S)
        return config["config"]

    async def live(self) -> bool:
        try:
            return bool(await self._call(self._control.is_server_live, client_timeout=CONTROL_TIMEOUT_S))
        except ProxyError:
            return False

    async def stream(self, model: str, values: dict, disconnected: Callable[[], Awaitable[bool]] | None = None,
                     param_of=lambda f: f, batched: bool = True) -> AsyncIterator[Outputs]:
        """Yields each response's outputs (batch dimension removed); raises ProxyError on a Triton
        error and ClientGone when `disconnected()` turns true while waiting. `batched`: whether the
        model has a batch dimension (the chat models' fronts have none)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_response(result, error):
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (result, error))
            except RuntimeError:      # the loop is closed: the proxy is shutting down
                pass

        client = grpcclient.InferenceServerClient(self.url)
        finished = False
        try:
            client.start_stream(callback=on_response, stream_timeout=self.timeout_s + STREAM_GRACE_S)
            client.async_stream_infer(model, make_inputs(grpcclient, values, batched), request_id=uuid.uuid4().hex,
                                      enable_empty_final_response=True)
            deadline = loop.time() + self.timeout_s
            while True:
                if loop.time() > deadline:      # here, not only when idle: a model may stream forever
                    raise ProxyError(504, f"{model} did not answer in {self.timeout_s:g} s", code="timeout")
                try:
                    result, error = await asyncio.wait_for(queue.get(), POLL_S)
                except asyncio.TimeoutError:
                    if disconnected is not None and await disconnected():
                        raise ClientGone() from None
                    continue
                if error is not None:
                    finished = True
                    raise from_triton(error, param_of)
                response = result.get_response()
                outputs = {o.name: result.as_numpy(o.name)[0] if batched else result.as_numpy(o.name)
                           for o in response.outputs}
                finished = is_final_response(response)
                if outputs:
                    yield outputs
                if finished:
                    return
        finally:
            # Off the event loop: stop_stream joins the client's reader thread.
            threading.Thread(target=_close, args=(client, not finished), daemon=True).start()

    async def collect(self, model: str, values: dict, disconnected=None, param_of=lambda f: f,
                      batched: bool = True) -> list[Outputs]:
        """Every response of a request (for answers sent whole)."""
        out = []
        async for outputs in self.stream(model, values, disconnected, param_of, batched):
            out.append(outputs)
        return out

    def close(self) -> None:
        self._control.close()


async def first_response(replies: AsyncIterator[Outputs]) -> Outputs:
    """A stream's first response, awaited before the HTTP answer starts: an error then is still
    an HTTP error (400, 503, ...), not a 200 with an error inside."""
    try:
        return await anext(replies)
    except StopAsyncIteration:
        raise ProxyError(500, "the model ended the request without an answer", code="model_error") from None
    except BaseException:
        await replies.aclose()
        raise


def _close(client, cancel: bool) -> None:
    try:
        client.stop_stream(cancel_requests=cancel)
    finally:
        client.close()
