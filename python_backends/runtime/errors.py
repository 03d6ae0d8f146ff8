"""Errors a step raises, and the Triton error code each becomes.

A step raises `InvalidInput` for anything the client got wrong; it becomes INVALID_ARG (HTTP 400,
gRPC INVALID_ARGUMENT) for that one request only; `Unavailable` for a capacity limit that a retry
later may pass (UNAVAILABLE). Any other exception is a server fault: INTERNAL.
"""
from __future__ import annotations


class InvalidInput(ValueError):
    """The request is wrong. The message names the field: "field 'max_tokens': must be > 0"."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"field '{field}': {reason}")
        self.field = field


class Unsupported(Exception):
    """The request asks for something this model cannot do."""


class Unavailable(Exception):
    """The server cannot take this request now (a capacity limit is reached); a retry may succeed. Its
    message ends "retry later": the proxy reads that (a stream's error keeps only its text) as a 429."""


class Cancelled(Exception):
    """The client cancelled the request (or its stream went away)."""


MAX_MESSAGE_CHARS = 2000   # an error that quotes its input (a list of a million ids) stays readable


def error_message(exc: BaseException, internal: bool) -> str:
    msg = f"{type(exc).__name__}: {exc}" if internal else str(exc)
    if len(msg) > MAX_MESSAGE_CHARS:
        msg = f"{msg[:MAX_MESSAGE_CHARS]}... ({len(msg) - MAX_MESSAGE_CHARS} more characters)"
    return msg


ERROR_CODES = ((InvalidInput, "INVALID_ARG"), (Unsupported, "UNSUPPORTED"), (Cancelled, "CANCELLED"),
               (Unavailable, "UNAVAILABLE"))


def error_code(exc: BaseException) -> str:
    """The name of the Triton error code `exc` becomes (also the `code` label of the error counters)."""
    return next((code for cls, code in ERROR_CODES if isinstance(exc, cls)), "INTERNAL")


def to_triton_error(exc: BaseException, pb_utils):
    code = error_code(exc)
    return pb_utils.TritonError(error_message(exc, code == "INTERNAL"), getattr(pb_utils.TritonError, code))


def forget_traceback(exc: BaseException) -> None:
    """Drop the tracebacks of `exc` and of the exceptions chained to it, once it has been logged.

    A step keeps per-request exceptions in a list. A traceback holds the frames it passed and, on
    CPython >= 3.11, their callers' frames, one of which holds that list: a reference cycle that only
    the garbage collector frees, keeping Triton's request objects alive meanwhile, to be destroyed by
    a collection on whichever thread triggers it. At the stub's exit that crashed it (a pre step's:
    SIGSEGV in an InferRequest destructor called from Py_FinalizeEx; the adapter's finalize now
    collects before exit too); without the cycle they go when the execute that held them returns."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]
