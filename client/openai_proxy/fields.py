"""Reading a request: content type (415), size (413), JSON or multipart body, typed fields (400).

Handlers read their fields through `Fields`, which names the offending field in every error, so a
client learns exactly what to fix: `'temperature': must be a number in [0, 2], got 'hot'`.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable

from fastapi import Request
from starlette.datastructures import FormData, UploadFile

from triton_omni.client.openai_proxy.errors import ProxyError, bad_field, missing

DRAIN_BYTES = 64 << 20     # how much of an oversized body is read (and dropped) before the 413


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def refuse(request: Request, error: ProxyError):
    """Raise `error` once the body is read (and dropped, up to DRAIN_BYTES): answering while the
    client still sends would reset its connection, and it would never see the error."""
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > DRAIN_BYTES:
                break
    except Exception:  # noqa: BLE001 - the client is gone or the body is consumed: nothing to drain
        pass
    raise error


async def _require_type(request: Request, *allowed: str) -> None:
    if media_type(request) not in allowed:
        got = request.headers.get("content-type") or "none"
        await refuse(request, ProxyError(415, f"Content-Type must be {' or '.join(allowed)}, got {got}",
                                         code="unsupported_media_type"))


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it passes `limit` bytes (declared or streamed). The rest of
    an oversized body is read and dropped (up to DRAIN_BYTES) before answering: a client still
    sending when the connection closes sees a reset instead of the 413."""
    too_big = ProxyError(413, f"request body is larger than the limit of {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length")
    declared = int(declared) if declared and declared.isdigit() else None
    if declared is not None and declared > limit + DRAIN_BYTES:
        raise too_big
    over = declared is not None and declared > limit
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit + DRAIN_BYTES:
            break
        if over or size > limit:
            over, chunks = True, []
            continue
        chunks.append(chunk)
    if over:
        raise too_big
    body = b"".join(chunks)
    request._body = body        # Starlette's form parser reads the cached body
    return body


async def json_body(request: Request, limit: int) -> "Fields":
    await _require_type(request, "application/json")
    raw = await read_body(request, limit)
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProxyError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ProxyError(400, "the body must be a JSON object", code="invalid_json")
    return Fields(data)


async def form_body(request: Request, limit: int) -> "Fields":
    await _require_type(request, "multipart/form-data")
    await read_body(request, limit)
    try:
        form = await request.form(max_part_size=limit)
    except Exception as e:  # noqa: BLE001 - python-multipart's errors: a malformed body
        raise ProxyError(400, f"the multipart body could not be parsed: {e}", code="invalid_body") from None
    return Fields(form, form=True)


async def json_or_form(request: Request, limit: int) -> "Fields":
    return await (form_body if media_type(request) == "multipart/form-data" else json_body)(request, limit)


class Fields:
    """Typed access to a JSON object or a multipart form (whose values arrive as strings)."""

    def __init__(self, data: dict | FormData, form: bool = False):
        self.data, self.form = data, form

    def has(self, name: str) -> bool:
        return name in self.data and self.data[name] is not None

    def raw(self, name: str) -> Any:
        return self.data.get(name)

    def string(self, name: str, required: bool = False, choices: Iterable[str] | None = None,
               default: str | None = None) -> str | None:
        value = self.data.get(name)
        if value is None:
            if required:
                raise missing(name)
            return default
        if not isinstance(value, str):
            raise bad_field(name, f"expected a string, got {json.dumps(_plain(value))}")
        if choices is not None and value not in choices:
            raise bad_field(name, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def number(self, name: str, lo: float | None = None, hi: float | None = None, integer: bool = False,
               lo_open: bool = False, default: float | None = None) -> float | int | None:
        value = self.data.get(name)
        if value is None:
            return default
        what = "an integer" if integer else "a number"
        if lo is not None and hi is not None:
            what += f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        elif lo is not None:
            what += f" {'>' if lo_open else '>='} {lo:g}"
        if self.form and isinstance(value, str):
            try:
                value = int(value) if integer else float(value)
            except ValueError:
                raise bad_field(name, f"must be {what}, got {value!r}") from None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if ok and integer and isinstance(value, float):
            ok = value.is_integer()
            value = int(value)
        if ok and lo is not None:
            ok = value > lo if lo_open else value >= lo
        if ok and hi is not None:
            ok = value <= hi
        if not ok:
            raise bad_field(name, f"must be {what}, got {json.dumps(_plain(value))}")
        return value

    def boolean(self, name: str, default: bool | None = None) -> bool | None:
        value = self.data.get(name)
        if value is None:
            return default
        if self.form and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise bad_field(name, f"must be true or false, got {json.dumps(_plain(value))}")
        return value

    def files(self, *names: str) -> list[tuple[str, UploadFile]]:
        """Uploaded files under any of these names (`image`, `image[]`), in order."""
        if not self.form:
            return []
        return [(n, v) for n in names for v in self.data.getlist(n) if isinstance(v, UploadFile)]

    async def file_bytes(self, *names: str, required: bool = False) -> bytes | None:
        found = self.files(*names)
        if not found:
            if required:
                raise missing(names[0])
            return None
        data = await found[0][1].read()
        if not data:
            raise bad_field(found[0][0], "the uploaded file is empty")
        return data


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, list, dict, type(None))) else str(value)
