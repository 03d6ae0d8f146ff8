"""One request to a Triton model and its responses as they come, over gRPC or HTTP.

gRPC (`host:8001`, or `grpc://host:8001`): the request goes on its own bidirectional stream, which
serves every model, streaming (decoupled) or not. Closing the generator early closes the stream
with `cancel_requests=True`, so the server stops working on it.

HTTP (`http://host:8000`): a non-streaming model is called with `infer` (binary tensors); a streaming
one through Triton's `generate_stream` extension, whose JSON carries text and numbers only.
"""
from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
import uuid
from typing import Any, Callable, Iterator

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from triton_omni.client.tensors import as_array, make_inputs

Outputs = dict[str, np.ndarray]          # one response's tensors, batch dimension removed
_BATCHED: dict[tuple[str, str], bool] = {}
Values = dict[str, tuple[Any, str]]       # input name -> (value, Triton dtype); None: left out


def _http():
    """tritonclient.http, imported on first use: gRPC-only installs (no gevent) still work."""
    import tritonclient.http as httpclient

    return httpclient


def is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def host_port(url: str) -> str:
    for scheme in ("grpc://", "http://", "https://"):
        if url.startswith(scheme):
            return url[len(scheme):].rstrip("/")
    return url.rstrip("/")


def responses(url: str, model: str, values: Values, timeout_s: float = 300.0,
              last: Callable[[Outputs], bool] | None = None, batched: bool | None = None) -> Iterator[Outputs]:
    """Yields each response's outputs. `last(outputs)` may say that a response ends the request
    (the chat models mark it with a finish_reason) so the caller need not wait for the stream end.
    `batched`: whether the model has a batch dimension (None: read from its config)."""
    if is_http(url):
        return _http_responses(url, model, values, timeout_s)
    if batched is None:
        batched = model_batches(url, model)
    return _grpc_responses(host_port(url), model, values, timeout_s, last, batched)


def model_batches(url: str, model: str) -> bool:
    """Whether `model` has a batch dimension; a model's batching is fixed by its config, so it is asked
    once per process (the first request of a model costs this one config call more)."""
    key = (host_port(url), model)
    if key not in _BATCHED:
        _BATCHED[key] = is_batched(model_config(url, model))
    return _BATCHED[key]


def is_final_response(response) -> bool:
    """Whether a streamed gRPC response (ModelInferResponse) is its request's last: Triton marks it
    when the request asked for `enable_empty_final_response`."""
    params = response.parameters
    return "triton_final_response" in params and params["triton_final_response"].bool_param


def _outputs(result, names, batched: bool = True) -> Outputs:
    return {name: result.as_numpy(name)[0] if batched else result.as_numpy(name) for name in names}


def is_batched(config: dict) -> bool:
    return int(config.get("max_batch_size", 0)) > 0


def _grpc_responses(url: str, model: str, values: Values, timeout_s: float,
                    last: Callable[[Outputs], bool] | None, batched: bool = True) -> Iterator[Outputs]:
    inputs = make_inputs(grpcclient, values, batched)
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    finished = False
    try:
        # The empty final response tells a finished streaming request from a slow one.
        client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True)
        while True:
            try:
                result, error = results.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"{model}: no response in {timeout_s:.0f} s") from None
            if error is not None:
                finished = True          # the server ended the request itself
                raise error
            response = result.get_response()
            outputs = _outputs(result, [o.name for o in response.outputs], batched)
            final = is_final_response(response)
            done = final or bool(outputs and last and last(outputs))
            finished = finished or done
            if outputs:
                yield outputs
            if done:
                return
    finally:
        client.stop_stream(cancel_requests=not finished)
        client.close()


def model_config(url: str, model: str) -> dict:
    """The model's config as JSON (over HTTP or gRPC, following the url)."""
    if is_http(url):
        client = _http().InferenceServerClient(host_port(url))
        try:
            return client.get_model_config(model)
        finally:
            client.close()
    client = grpcclient.InferenceServerClient(host_port(url))
    try:
        return client.get_model_config(model, as_json=True)["config"]
    finally:
        client.close()


def is_decoupled(config: dict) -> bool:
    return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


def _http_responses(url: str, model: str, values: Values, timeout_s: float) -> Iterator[Outputs]:
    config = model_config(url, model)
    if is_decoupled(config):
        yield from _generate_stream(url, model, values, timeout_s)
        return
    httpclient = _http()
    client = httpclient.InferenceServerClient(host_port(url), connection_timeout=timeout_s, network_timeout=timeout_s)
    try:
        names = [o["name"] for o in config.get("output", [])]
        wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in names]
        batched = is_batched(config)
        result = client.infer(model, make_inputs(httpclient, values, batched), outputs=wanted)
        yield _outputs(result, names, batched)
    finally:
        client.close()


def _json_value(name: str, value: Any, dtype: str) -> Any:
    item = as_array(value, dtype).reshape(-1)
    if item.size != 1:
        raise ValueError(f"input {name!r}: HTTP streaming takes one value per input; use gRPC")
    v = item[0]
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"input {name!r}: binary data cannot travel over HTTP streaming; use gRPC") from None
    return v.item()


def _generate_stream(url: str, model: str, values: Values, timeout_s: float) -> Iterator[Outputs]:
    """Triton's generate_stream extension: JSON in, server-sent events out (text outputs only)."""
    body = {name: _json_value(name, v, dtype) for name, (v, dtype) in values.items() if v is not None}
    base = url.rstrip("/")
    req = urllib.request.Request(f"{base}/v2/models/{model}/generate_stream", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as e:
        raise InferenceServerException(msg=_error_text(e.read()), status=str(e.code)) from None
    with resp:    # leaving early closes the connection, which cancels the request
        for line in resp:
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise InferenceServerException(msg=str(event["error"]))
            yield {k: _from_json(v) for k, v in event.items() if k not in ("model_name", "model_version", "id")}


def _error_text(raw: bytes) -> str:
    try:
        return json.loads(raw).get("error", raw.decode(errors="replace"))
    except (ValueError, AttributeError):
        return raw.decode(errors="replace")


def _from_json(value: Any) -> np.ndarray:
    if isinstance(value, str):
        return np.array([value.encode("utf-8")], dtype=np.object_)
    return np.array([value]).reshape(-1)
