"""Tensor declarations shared by step classes (what a step reads and writes) and the converter."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Triton data type -> numpy dtype (TYPE_STRING travels as numpy object arrays of bytes).
TRITON_DTYPES: dict[str, object] = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64, "TYPE_BF16": None, "TYPE_STRING": np.object_,
}


# Bounds every step input gets unless it declares its own (`TensorSpec.max_dims`, `Step.input_limits`):
# what one request may send at all, so a absurd shape is refused before a step allocates for it.
DEFAULT_MAX_ITEMS = 1 << 26          # elements of one input (256 MB of float32)
DEFAULT_MAX_BYTES = 64 << 20         # bytes of one input's strings together


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor of a step, without the batch dimension."""

    name: str
    dtype: str                 # a Triton type name, e.g. "TYPE_INT32"
    dims: tuple[int, ...] = (1,)
    optional: bool = False     # inputs only: the request may leave it out
    ragged: bool = False       # inputs only: requests of different lengths may share a batch
    control: bool = False      # inputs only: sent to the step directly, never wired in the ensemble
    # inputs only: the most entries one request may send along each variable (-1) dimension, in
    # order; None leaves that dimension to the step's `input_limits()` or to DEFAULT_MAX_ITEMS
    max_dims: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.dtype not in TRITON_DTYPES:
            raise ValueError(f"tensor {self.name!r}: unknown Triton dtype {self.dtype!r}")
