"""Building request tensors: every triton-omni ensemble takes one item per request ([1, ...])."""
from __future__ import annotations

import json
from typing import Any

import numpy as np


def as_array(value: Any, dtype: str) -> np.ndarray:
    if dtype == "BYTES":
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        if isinstance(value, str):
            value = value.encode("utf-8")
        return np.array([[value]], dtype=np.object_)
    if dtype == "BOOL":
        return np.array([[bool(value)]], dtype=np.bool_)
    arr = np.asarray(value, dtype={"INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "UINT8": np.uint8}[dtype])
    return arr.reshape(1, *arr.shape) if arr.ndim else arr.reshape(1, 1)


def make_inputs(module, values: dict[str, tuple[Any, str]]) -> list:
    """values: name -> (value, Triton dtype string); None values are left out (optional inputs)."""
    inputs = []
    for name, (value, dtype) in values.items():
        if value is None:
            continue
        arr = as_array(value, dtype)
        t = module.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs
