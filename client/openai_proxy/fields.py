"""Reading a request: content type (415), size (413), JSON or multipart body, typed fields (400).

Everything here runs before a handler does any real work (a Triton call, a tokenizer): a bad
request costs the proxy a parse, never the model. Two layers:
- `check_shape`, once per body, at parse time: no text longer than `max_text_chars` characters,
  no list or object with more than MAX_ITEMS entries, nothing nested deeper than MAX_DEPTH, no
  NaN / Infinity (Python's json reads them; JSON has none) and no integer of more than
  MAX_INT_DIGITS digits, anywhere in the body, named by its path (`messages[0].content`);
- `Fields`, as a handler reads a field: its type and range. Numbers always have a range (by
  default that of the tensor type they travel as), so no 1e308 or 2**70 reaches a model, and an
  integer field refuses 1.5 rather than cutting it to 1.
Every error names the field, so a client learns exactly what to fix:
`'temperature': expected a number in [0, 2], got "hot"`.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable

from fastapi import Request
from starlette.datastructures import FormData, UploadFile

from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import ProxyError, bad_field, missing

DRAIN_BYTES = 64 << 20     # how much of an oversized body is read (and dropped) before the 413
MAX_ITEMS = 4096           # entries of one list or object (messages, stop_token_ids, ...)
MAX_DEPTH = 32             # nesting of lists and objects
MAX_INT_DIGITS = 24        # past any int64; longer integers are refused before they are converted
MAX_FILES = 16             # uploaded files in one multipart body (OpenAI's image edits take 16)
SHOWN_CHARS = 80           # of a bad value, echoed in its error
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
FP32_MAX = 3.4028234663852886e38


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


async def json_body(request: Request) -> "Fields":
    await _require_type(request, "application/json")
    settings = proxy_of(request).settings
    return parse_json(await read_body(request, settings.max_body_bytes), settings.max_text_chars,
                      settings.max_body_bytes)


def parse_json(raw: bytes, max_text_chars: int, max_data_url_chars: int | None = None) -> "Fields":
    """A JSON body, its shape checked (`check_shape`)."""
    try:
        data = json.loads(raw, parse_int=_int_or_huge)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProxyError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise ProxyError(400, f"the body is nested deeper than {MAX_DEPTH} levels", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ProxyError(400, "the body must be a JSON object", code="invalid_json")
    check_shape(data, max_text_chars, max_data_url_chars)
    return Fields(data)


async def form_body(request: Request) -> "Fields":
    await _require_type(request, "multipart/form-data")
    settings = proxy_of(request).settings
    await read_body(request, settings.max_body_bytes)
    try:
        form = await request.form(max_files=MAX_FILES, max_part_size=settings.max_body_bytes)
    except Exception as e:  # noqa: BLE001 - python-multipart's errors: a malformed body
        raise ProxyError(400, f"the multipart body could not be parsed: {e}", code="invalid_body") from None
    for name, value in form.multi_items():
        if isinstance(value, UploadFile) and (value.size or 0) > settings.max_upload_bytes:
            raise ProxyError(413, f"'{name}': the uploaded file has {value.size} bytes; at most "
                                  f"{settings.max_upload_bytes} are accepted", param=name, code="file_too_large")
    check_shape(form, settings.max_text_chars)
    return Fields(form, form=True)


async def json_or_form(request: Request) -> "Fields":
    return await (form_body if media_type(request) == "multipart/form-data" else json_body)(request)


class HugeInt:
    """An integer literal of more than MAX_INT_DIGITS digits, kept as its length: never converted."""

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _int_or_huge(literal: str) -> int | HugeInt:
    return int(literal) if len(literal.lstrip("-")) <= MAX_INT_DIGITS else HugeInt(len(literal))


def check_shape(data: dict | FormData, max_text_chars: int, max_data_url_chars: int | None = None) -> None:
    """Refuse (400, naming the value's path) any text, list or nesting past the limits, and any
    value that is no finite JSON number. Iterative: a deep body cannot exhaust the stack. A path is
    built only for the error (a (parent, key) chain), so long keys cost nothing on the way. A
    `data:` URL (an image in a chat message) may have up to `max_data_url_chars` characters."""
    items = data.multi_items() if isinstance(data, FormData) else data.items()
    stack = [(value, (None, key), 1) for key, value in reversed(list(items))]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            most = max_data_url_chars if max_data_url_chars and value.startswith("data:") else max_text_chars
            if len(value) > most:
                raise bad_field(_path(where), f"has {len(value)} characters; at most {most} are accepted")
        elif isinstance(value, HugeInt):
            raise bad_field(_path(where), f"{value!r} is out of range")
        elif isinstance(value, float) and not math.isfinite(value):
            raise bad_field(_path(where), f"{json.dumps(value)} is not a number JSON allows")
        elif isinstance(value, (list, dict)):
            if len(value) > MAX_ITEMS:
                raise bad_field(_path(where), f"has {len(value)} entries; at most {MAX_ITEMS} are accepted")
            if depth >= MAX_DEPTH:
                raise bad_field(_path(where), f"is nested deeper than {MAX_DEPTH} levels")
            children = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in reversed(list(children)):
                if isinstance(key, str) and len(key) > max_text_chars:
                    raise bad_field(_path(where), f"has a key of {len(key)} characters")
                stack.append((child, (where, key), depth + 1))


def _path(where: tuple) -> str:
    keys = []
    while where is not None:
        where, key = where
        keys.append(key)
    out = ""
    for key in reversed(keys):
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


class Fields:
    """Typed access to a JSON object or a multipart form (whose values arrive as strings)."""

    def __init__(self, data: dict | FormData, form: bool = False):
        self.data, self.form = data, form

    def has(self, name: str) -> bool:
        return name in self.data and self.data[name] is not None

    def raw(self, name: str) -> Any:
        return self.data.get(name)

    def string(self, name: str, required: bool = False, choices: Iterable[str] | None = None,
               default: str | None = None, max_chars: int | None = None) -> str | None:
        value = self.data.get(name)
        if value is None:
            if required:
                raise missing(name)
            return default
        if not isinstance(value, str):
            raise bad_field(name, f"expected a string, got {shown(value)}")
        if choices is not None and value not in choices:
            raise bad_field(name, f"expected one of {', '.join(choices)}, got {shown(value)}")
        if max_chars is not None and len(value) > max_chars:
            raise bad_field(name, f"has {len(value)} characters; at most {max_chars} are accepted")
        return value

    def number(self, name: str, lo: float | None = None, hi: float | None = None, integer: bool = False,
               lo_open: bool = False, default: float | None = None, strings: bool = False) -> float | int | None:
        """A number in [lo, hi] (`lo_open`: (lo, hi]); without bounds, those of an INT32 or FP32
        tensor. A form's strings are parsed, and a JSON string too where `strings` (OpenAI sends
        some numbers as strings, e.g. a video's `seconds`). An integer field takes 2.0 as 2 and
        refuses 1.5."""
        value = self.data.get(name)
        if value is None:
            return default
        lo = (INT32_MIN if integer else -FP32_MAX) if lo is None else lo
        hi = (INT32_MAX if integer else FP32_MAX) if hi is None else hi
        want = f"{'an integer' if integer else 'a number'} in {'(' if lo_open else '['}{_bound(lo)}, {_bound(hi)}]"
        if isinstance(value, str) and (self.form or strings):
            value = _parse_number(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad_field(name, f"expected {want}, got {shown(value)}")
        if not math.isfinite(value):
            raise bad_field(name, f"{shown(value)} is not a finite number; expected {want}")
        if integer and isinstance(value, float) and not value.is_integer():
            raise bad_field(name, f"{shown(value)} is not an integer; expected {want}")
        if value > hi or (value <= lo if lo_open else value < lo):     # compared before int(): 1e308 stays a float
            raise bad_field(name, f"{shown(value)} is out of range; expected {want}")
        return int(value) if integer else value

    def boolean(self, name: str, default: bool | None = None) -> bool | None:
        value = self.data.get(name)
        if value is None:
            return default
        if self.form and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise bad_field(name, f"must be true or false, got {shown(value)}")
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


def shown(value: Any) -> str:
    """A bad value as its error echoes it: short, whatever was sent."""
    if isinstance(value, str):
        return json.dumps(value[:SHOWN_CHARS]) + ("..." if len(value) > SHOWN_CHARS else "")
    if isinstance(value, (bool, int, float, type(None))):
        return json.dumps(value)
    if isinstance(value, (list, dict)):
        return f"{'a list' if isinstance(value, list) else 'an object'} of {len(value)} entries"
    return repr(value)[:SHOWN_CHARS]


def _bound(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _parse_number(text: str) -> int | float | str:
    """A form's (or a JSON string's) number; the text itself when it is none (refused by the caller)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:      # also an integer of more than 4300 digits
            pass
    return text
