"""Bad requests for any model Triton serves, derived from its config alone.

Every model in the repository can be called directly (an ensemble's internal steps too), so each gets
the same corpus: a baseline request (every input present, its variable dimensions 1 long, zeros or
"x"), then per input: missing, extra, wrong dtype, wrong rank, empty, oversized (a 1,048,576-long
dimension, or one 4 MB string), NaN and inf, negative and absurd numbers, invalid UTF-8, broken media
bytes. An answer (a result or an error) is fine; what the report counts as faults is an INTERNAL
error, a request past its deadline (a hang), a stream without its final response, and a stub or
server that died (`run.py` finds those).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

HUGE = 1 << 20
NUMPY = {"TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_FP64": np.float64, "TYPE_INT32": np.int32,
         "TYPE_INT64": np.int64, "TYPE_INT16": np.int16, "TYPE_INT8": np.int8, "TYPE_UINT8": np.uint8,
         "TYPE_BOOL": np.bool_, "TYPE_STRING": np.object_, "TYPE_BF16": np.float32}
WIRE = {"TYPE_FP32": "FP32", "TYPE_FP16": "FP16", "TYPE_FP64": "FP64", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64",
        "TYPE_INT16": "INT16", "TYPE_INT8": "INT8", "TYPE_UINT8": "UINT8", "TYPE_BOOL": "BOOL",
        "TYPE_STRING": "BYTES", "TYPE_BF16": "BF16"}
MEDIA_WORDS = ("image", "audio", "video", "reference")
# what a broken file looks like: a PNG / RIFF / MP4 header and then nothing that decodes
BROKEN_MEDIA = (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\xff" * 32,
                b"\x00\x00\x00\x18ftypmp42" + b"\x01" * 64)


@dataclass(frozen=True)
class Tensor:
    name: str
    data: np.ndarray
    wire: str


@dataclass(frozen=True)
class Case:
    model: str
    kind: str                  # "baseline", "missing", "oversized", ...
    input: str                 # the input it changes ("" for the baseline)
    tensors: tuple[Tensor, ...]


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str                 # TYPE_*
    dims: tuple[int, ...]      # with the batch dimension first when the model batches
    optional: bool


def specs(config: dict) -> list[InputSpec]:
    """The inputs of a model config (Triton's JSON form, as /v2/models/X/config gives it)."""
    batched = int(config.get("max_batch_size", 0)) > 0
    out = []
    for i in config.get("input", []):
        dims = tuple(int(d) for d in i.get("dims", []))
        out.append(InputSpec(i["name"], i["data_type"], ((1,) if batched else ()) + dims, bool(i.get("optional"))))
    return out


def fill(spec: InputSpec, dims: tuple[int, ...] | None = None, value: Any = None) -> Tensor:
    shape = tuple(1 if d < 0 else d for d in (dims if dims is not None else spec.dims))
    dtype = NUMPY.get(spec.dtype, np.float32)
    if spec.dtype == "TYPE_STRING":
        data = np.full(shape, b"x" if value is None else value, dtype=np.object_)
    else:
        data = np.full(shape, 0 if value is None else value).astype(dtype)
    return Tensor(spec.name, data, WIRE.get(spec.dtype, "FP32"))


def _with(inputs: list[InputSpec], name: str, tensor: Tensor | None) -> tuple[Tensor, ...]:
    """The baseline with input `name` replaced by `tensor` (None: left out)."""
    out = []
    for s in inputs:
        if s.name == name:
            if tensor is not None:
                out.append(tensor)
        else:
            out.append(fill(s))
    return tuple(out)


def cases(model: str, config: dict) -> list[Case]:
    inputs = specs(config)
    out = [Case(model, "baseline", "", tuple(fill(s) for s in inputs))]
    if inputs:
        out.append(Case(model, "extra", "no_such_input",
                        tuple(fill(s) for s in inputs) + (Tensor("no_such_input", np.zeros(1, np.float32), "FP32"),)))
    for s in inputs:
        add = lambda kind, t: out.append(Case(model, kind, s.name, _with(inputs, s.name, t)))  # noqa: E731
        if not s.optional:
            add("missing", None)
        string = s.dtype == "TYPE_STRING"
        shape = tuple(1 if d < 0 else d for d in s.dims)
        add("wrong_dtype", Tensor(s.name, np.zeros(shape, np.float32), "FP32") if string
            else Tensor(s.name, np.full(shape, b"x", np.object_), "BYTES"))
        add("wrong_rank", fill(s, s.dims + (2,)))
        variable = [i for i, d in enumerate(s.dims) if d < 0]
        if variable:
            axis = variable[-1]
            add("empty", fill(s, tuple(0 if i == axis else d for i, d in enumerate(s.dims))))
            if not string:
                add("oversized", fill(s, tuple(HUGE if i == axis else d for i, d in enumerate(s.dims))))
        if string:
            add("oversized_string", fill(s, value=b"a" * (4 << 20)))
            add("invalid_utf8", fill(s, value=b"\xff\xfe\xc3\x28"))
            add("not_json", fill(s, value=b"{\"unclosed\": "))
            if any(w in s.name for w in MEDIA_WORDS):
                for i, blob in enumerate(BROKEN_MEDIA):
                    add(f"broken_media_{i}", fill(s, value=blob))
        elif s.dtype in ("TYPE_FP32", "TYPE_FP16", "TYPE_FP64", "TYPE_BF16"):
            add("nan", fill(s, value=np.nan))
            add("inf", fill(s, value=np.inf))
            add("absurd", fill(s, value=1e30))
        elif s.dtype in ("TYPE_INT32", "TYPE_INT64"):
            add("negative", fill(s, value=-1))
            add("absurd", fill(s, value=np.iinfo(NUMPY[s.dtype]).max))
    return out
