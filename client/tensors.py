"""Building request tensors and reading response tensors.

Every triton-omni model takes one item per request. Batched models (max_batch_size > 0, all but the
chat models' fronts) take inputs as `[1, ...]` and answer `[1, ...]`, whose batch dimension the readers
below remove; an unbatched one (max_batch_size 0, like Triton's vLLM backend models) takes the item
itself (`batched=False`).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

NUMPY = {"INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "UINT8": np.uint8}


def as_array(value: Any, dtype: str) -> np.ndarray:
    """One request's value as a `[1, ...]` array. For BYTES: dicts and lists become one JSON string,
    except a list of `bytes`, which becomes that many items (encoded images, say); a numpy array is
    taken as the item itself and gets the batch dimension."""
    if isinstance(value, np.ndarray):
        return value[None]
    if dtype == "BYTES":
        if isinstance(value, list) and value and all(isinstance(v, (bytes, bytearray)) for v in value):
            return np.array([[bytes(v) for v in value]], dtype=np.object_)
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        if isinstance(value, str):
            value = value.encode("utf-8")
        return np.array([[value]], dtype=np.object_)
    if dtype == "BOOL":
        return np.array([[bool(value)]], dtype=np.bool_)
    arr = np.asarray(value, dtype=NUMPY[dtype])
    return arr.reshape(1, *arr.shape) if arr.ndim else arr.reshape(1, 1)


def make_inputs(module, values: dict[str, tuple[Any, str]], batched: bool = True) -> list:
    """values: name -> (value, Triton dtype string); None values are left out (optional inputs).
    `module` is tritonclient.grpc or tritonclient.http; `batched` False: no batch dimension."""
    inputs = []
    for name, (value, dtype) in values.items():
        if value is None:
            continue
        arr = as_array(value, dtype)
        if not batched:
            arr = arr[0]
        t = module.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


# -- reading outputs (batch dimension already removed: see triton_omni.client.triton) --------------------------
def first(outputs: dict[str, np.ndarray], name: str, default: Any = None) -> Any:
    """The first element of an output, as a Python value (bytes for BYTES tensors)."""
    value = outputs.get(name)
    if value is None or value.size == 0:
        return default
    item = value.reshape(-1)[0]
    return item.item() if isinstance(item, np.generic) else item


def text(outputs: dict[str, np.ndarray], name: str, default: str = "") -> str:
    value = first(outputs, name)
    if value is None:
        return default
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def items(outputs: dict[str, np.ndarray], name: str) -> list[bytes]:
    """Every element of a BYTES output (e.g. the encoded images of `images`)."""
    value = outputs.get(name)
    return [] if value is None else [bytes(v) for v in value.reshape(-1)]
