"""The checks every step's inputs pass before the step sees them.

Triton checks dtypes and ranks against config.pbtxt, but not how long a variable (-1) dimension is, and
an ensemble does not refuse a request that lacks a required input (the step after it never runs and
the client gets "unexpected deadlock"). Here: required inputs present, each variable dimension within
its bound, strings within their byte budget. A request that fails gets INVALID_ARG naming the input;
it never reaches the step, so one absurd request cannot make a step allocate for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import DEFAULT_MAX_BYTES, DEFAULT_MAX_ITEMS, TensorSpec


@dataclass(frozen=True)
class Bound:
    spec: TensorSpec
    max_dims: tuple[int | None, ...]      # per dimension of one request's tensor (no batch dimension)

    def check(self, value: Any) -> None:
        name, shape = self.spec.name, tuple(value.shape)
        if len(shape) != len(self.max_dims):
            raise InvalidInput(name, f"expected {len(self.max_dims)} dimensions, got shape {list(shape)}")
        for axis, (size, most) in enumerate(zip(shape, self.max_dims)):
            if most is not None and size > most:
                raise InvalidInput(name, f"dimension {axis} has {size} entries; at most {most} are accepted")
        items = 1
        for size in shape:
            items *= size
        if items > DEFAULT_MAX_ITEMS:
            raise InvalidInput(name, f"{items} elements; at most {DEFAULT_MAX_ITEMS} are accepted")
        if self.spec.dtype == "TYPE_STRING":
            total = sum(len(v) for v in value.reshape(-1) if isinstance(v, (bytes, str)))
            if total > DEFAULT_MAX_BYTES:
                raise InvalidInput(name, f"{total} bytes; at most {DEFAULT_MAX_BYTES} are accepted")


class InputGuard:
    """Built once per step instance from its declared inputs and its `input_limits()`."""

    def __init__(self, inputs: tuple[TensorSpec, ...], limits: dict[str, tuple[int | None, ...]]):
        unknown = set(limits) - {s.name for s in inputs}
        if unknown:
            raise ValueError(f"input_limits() names inputs the step does not declare: {sorted(unknown)}")
        self.required = [s.name for s in inputs if not s.optional and not s.control]
        self.bounds = {s.name: Bound(s, self._max_dims(s, limits.get(s.name))) for s in inputs}

    @staticmethod
    def _max_dims(spec: TensorSpec, limit: tuple[int | None, ...] | None) -> tuple[int | None, ...]:
        declared = limit or spec.max_dims or (None,) * len(spec.dims)
        if len(declared) != len(spec.dims):
            raise ValueError(f"input {spec.name!r}: a bound for {len(declared)} dimensions, it has {len(spec.dims)}")
        # a fixed dimension needs no bound (Triton enforces it); a variable one takes the declared bound
        return tuple(None if d != -1 else most for d, most in zip(spec.dims, declared))

    def check(self, tensors: dict[str, Any]) -> None:
        for name in self.required:
            if name not in tensors:
                raise InvalidInput(name, "required input is missing")
        for name, value in tensors.items():
            self.bounds[name].check(value)
