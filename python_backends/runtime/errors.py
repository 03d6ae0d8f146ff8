"""Errors a step raises, and the Triton error code each becomes.

A step raises `InvalidInput` for anything the client got wrong; it becomes INVALID_ARG (HTTP 400,
gRPC INVALID_ARGUMENT) for that one request only. Any other exception is a server fault: INTERNAL.
"""
from __future__ import annotations


class InvalidInput(ValueError):
    """The request is wrong. The message names the field: "field 'max_tokens': must be > 0"."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"field '{field}': {reason}")
        self.field = field


class Unsupported(Exception):
    """The request asks for something this model cannot do."""


def triton_error_code(exc: BaseException, pb_utils) -> int:
    if isinstance(exc, InvalidInput):
        return pb_utils.TritonError.INVALID_ARG
    if isinstance(exc, Unsupported):
        return pb_utils.TritonError.UNSUPPORTED
    return pb_utils.TritonError.INTERNAL


def to_triton_error(exc: BaseException, pb_utils):
    msg = str(exc) if isinstance(exc, (InvalidInput, Unsupported)) else f"{type(exc).__name__}: {exc}"
    return pb_utils.TritonError(msg, triton_error_code(exc, pb_utils))
