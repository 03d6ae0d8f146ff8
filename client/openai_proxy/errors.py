"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the right status.

Everything the proxy rejects raises `ProxyError`; Triton's errors are translated by `from_triton`.
Over a gRPC stream Triton 2.51 sends only an error's text (its code is lost), so the translation
reads the text: the project's steps name the bad field (`field 'x': ...`, INVALID_ARG), and
Triton's own input checks say `unexpected ... input`; a full queue is a 429 with Retry-After. Anything else is a server error, answered
with a generic message and an error id: its detail (a Python traceback, for a step that failed)
goes to the proxy's log under that id, never to the client.
"""
from __future__ import annotations

import logging
import re
import uuid
from typing import Callable

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
         404: "invalid_request_error", 405: "invalid_request_error", 409: "invalid_request_error",
         413: "invalid_request_error", 415: "invalid_request_error", 501: "invalid_request_error",
         429: "requests", 503: "service_unavailable", 504: "timeout"}
MAX_MESSAGE_CHARS = 2000    # an error echoes what it was sent: a 20 MB field must not come back whole
log = logging.getLogger("openai_proxy")


class ProxyError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + " ... (cut)"
        if param is not None and len(param) > 200:
            param = param[:200]
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or TYPES.get(status, "server_error")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def server_error(what: str, detail: str, code: str, exc: BaseException | None = None) -> ProxyError:
    """A 500 that tells the client only an id; the detail (and `exc`'s traceback) is logged under it."""
    error_id = uuid.uuid4().hex[:12]
    log.error("%s (error id %s): %s", what, error_id, detail, exc_info=exc)
    return ProxyError(500, f"{what} (error id {error_id}; the server's log has the detail)", code=code)


def bad_field(param: str, reason: str) -> ProxyError:
    return ProxyError(400, f"'{param}': {reason}", param=param, code="invalid_value")


def missing(param: str) -> ProxyError:
    return ProxyError(400, f"'{param}' is a required property", param=param, code="missing_required_parameter")


# A capacity limit, not a fault: Triton's queue policy ("Exceeds maximum queue size", "Request timeout
# expired") and the steps' own bounds (runtime/errors.Unavailable's messages end "retry later"). Read from
# the text, as a stream loses the code; answered 429 with Retry-After.
CAPACITY = ("Exceeds maximum queue size", "Request timeout expired", "retry later")
RETRY_AFTER_S = 1
_ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")
_FIELD = re.compile(r"field '([^']+)'")
_TRITON_INPUT_CHECKS = ("unexpected inference input", "unexpected shape", "unexpected datatype",
                        "expected datatype", "input byte size", "unexpected number of inputs")


def from_triton(exc: Exception, param_of: Callable[[str], str | None] = lambda f: f) -> ProxyError:
    """Translate a tritonclient error. `param_of` maps a model field (`sampling_parameters.top_p`)
    to the OpenAI request field it came from (`top_p`)."""
    message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    status = str(exc.status() or "") if hasattr(exc, "status") and callable(exc.status) else ""
    full = _ENSEMBLE_PREFIX.sub("", message or "")
    message = _without_traceback(full)
    if any(words in message for words in CAPACITY):
        return ProxyError(429, f"the model is at capacity: {message}", code="overloaded",
                          headers={"Retry-After": str(RETRY_AFTER_S)})
    if "UNAVAILABLE" in status or "failed to connect" in message.lower():
        return ProxyError(503, f"the Triton server is unavailable: {message}", code="triton_unavailable")
    if "DEADLINE_EXCEEDED" in status:
        return ProxyError(504, f"Triton did not answer in time: {message}", code="timeout")
    field = _FIELD.search(message)
    if field:
        return ProxyError(400, message, param=param_of(field.group(1)), code="invalid_value")
    if "INVALID_ARGUMENT" in status or status == "400" or any(s in message for s in _TRITON_INPUT_CHECKS):
        return ProxyError(400, message, code="invalid_value")
    if "unknown model" in message or "NOT_FOUND" in status:
        return ProxyError(404, message, param="model", code="model_not_found")
    if "UNSUPPORTED" in status or "UNIMPLEMENTED" in status:
        return ProxyError(400, message, code="unsupported")
    return server_error("the model failed", full, code="model_error")


# A Python backend appends the failing step's stack after "At:"; a Python traceback starts so.
_TRACEBACK = re.compile(r"\n\s*At:\n|Traceback \(most recent call last\)")


def _without_traceback(message: str) -> str:
    match = _TRACEBACK.search(message)
    return message[:match.start()].rstrip() if match else message


def install(app) -> None:
    """Every error the app returns, FastAPI's own included, in OpenAI's shape."""

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return ProxyError(exc.status_code, message, code="not_found" if exc.status_code == 404 else None).response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        # a bug: the client gets an id, the log the traceback (Starlette logs it again after this)
        return server_error("internal error", f"{request.method} {request.url.path}", "internal_error", exc).response()
