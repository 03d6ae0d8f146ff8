"""`data:<mime>;base64,<payload>` URLs in requests (chat content parts carrying images, videos, audio)."""
from __future__ import annotations

import base64
import binascii

from triton_omni.runtime.errors import InvalidInput


def decode_base64(payload: str, field: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(field, "is not valid base64") from None


def decode_data_url(url: str, field: str) -> tuple[str, bytes]:
    """A `data:<mime>;base64,<payload>` URL -> (mime, bytes)."""
    if url.startswith(("http://", "https://")):
        raise InvalidInput(field, "remote URLs are not fetched by the server; send a data: URL (base64) or the "
                                  "bytes in the request's media input")
    if not url.startswith("data:") or "," not in url:
        raise InvalidInput(field, "expected a data: URL (data:<mime type>;base64,<data>)")
    head, payload = url[5:].split(",", 1)
    if not head.endswith(";base64"):
        raise InvalidInput(field, "only base64 data: URLs are supported")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(field, "the data: URL's payload is not valid base64") from None
    return head[:-len(";base64")].lower(), data
