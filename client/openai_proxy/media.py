"""Images and videos in requests: chat content parts and embedding inputs, as bytes for the model.

Accepted parts: `image_url` (OpenAI), `video_url` and `audio_url` (vLLM's extensions) and `file` (OpenAI's
file input, an image/*, video/* or audio/* `file_data`), each a base64 `data:` URL, and `input_audio`
(OpenAI's audio input: base64 `data` and its `format`); the bytes travel to the model as its `images` /
`videos` / `audios` inputs, and the part becomes {"type": "image"} / {"type": "video"} / {"type": "audio"},
which takes them in order. http(s) URLs are fetched only when the proxy is started with --allow-media-urls (at
most max_upload_bytes each); otherwise refused with 400 naming the part, as is any other part type.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import urllib.request

from triton_omni.client.openai_proxy.errors import ProxyError, bad_field

FETCH_TIMEOUT_S = 20
URL_KEYS = {"image_url": "image", "video_url": "video", "audio_url": "audio"}
PARTS = ("text", "image_url", "video_url", "audio_url", "input_audio", "file")


def from_data_url(url: str, field: str, what: str = "") -> tuple[str, bytes]:
    """(mime type, bytes) of a base64 data: URL; errors name `field` (and `what` in it: image_url.url)."""
    head, sep, payload = url[5:].partition(",")
    lead = f"{what}: " if what else ""
    if not url.startswith("data:") or not sep or not head.endswith(";base64"):
        raise bad_field(field, f"{lead}expected a base64 data: URL (data:<mime type>;base64,<data>)")
    try:
        return head[:-len(";base64")].lower(), base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_field(field, f"{lead}the data: URL's payload is not valid base64") from None


def _fetch(url: str, limit: int, field: str) -> bytes:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "triton-omni"}),
                                    timeout=FETCH_TIMEOUT_S) as r:
            data = r.read(limit + 1)
    except Exception as e:  # noqa: BLE001 - any network failure is the request's URL
        raise bad_field(field, f"could not fetch {url[:200]}: {e}") from None
    if len(data) > limit:
        raise ProxyError(413, f"'{field}': the fetched file is larger than {limit} bytes", param=field,
                         code="file_too_large")
    return data


async def media_bytes(url, field: str, allow_urls: bool, limit: int, what: str = "") -> bytes:
    """The bytes a media URL stands for: a data: URL decoded, an http(s) URL fetched if allowed."""
    lead = f"{what}: " if what else ""
    if not isinstance(url, str):
        raise bad_field(field, f"{lead}expected a URL string")
    if url.startswith(("http://", "https://")):
        if not allow_urls:
            raise bad_field(field, f"{lead}remote URLs are not fetched (start the proxy with --allow-media-urls); "
                                   "send a base64 data: URL")
        return await asyncio.to_thread(_fetch, url, limit, field)
    data = from_data_url(url, field, what)[1]
    if len(data) > limit:
        raise ProxyError(413, f"'{field}': {len(data)} bytes; at most {limit} are accepted", param=field,
                         code="file_too_large")
    return data


def url_of(part: dict, key: str) -> tuple[object, str]:
    """A part's URL ({key: {'url': ...}} or {key: '...'}) and what to call it in errors."""
    value = part.get(key)
    return (value.get("url"), f"{key}.url") if isinstance(value, dict) else (value, key)


async def content_parts(content: list, where: str, allow_urls: bool, limit: int, media: dict[str, list[bytes]]) -> tuple[list, int]:
    """A message's parts for the model (text kept, media replaced by {"type": kind}, their bytes appended
    to media[kind]); also its text's length."""
    parts, chars = [], 0
    for j, part in enumerate(content):
        field = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in PARTS:
            raise bad_field(field, f"unsupported content part {kind!r}; accepted: {', '.join(PARTS)}")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise bad_field(f"{field}.text", "expected a string")
            parts.append({"type": "text", "text": part["text"]})
            chars += len(part["text"])
            continue
        if kind == "input_audio":          # OpenAI's audio input: {"data": base64, "format": "wav"}
            spec = part.get("input_audio")
            if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
                raise bad_field(field, "input_audio: expected {'data': '<base64>', 'format': 'wav' | 'mp3' | ...}")
            try:
                data = base64.b64decode(spec["data"], validate=True)
            except (binascii.Error, ValueError):
                raise bad_field(field, "input_audio.data: not valid base64") from None
            kind = "audio"
            if len(data) > limit:
                raise ProxyError(413, f"'{field}': {len(data)} bytes; at most {limit} are accepted", param=field,
                                 code="file_too_large")
        elif kind == "file":
            f = part.get("file")
            data_url = f.get("file_data") if isinstance(f, dict) else None
            if not isinstance(data_url, str):
                raise bad_field(field, "file: expected {'file_data': 'data:<image, video or audio type>;base64,...'}")
            mime, data = from_data_url(data_url, field, "file.file_data")
            kind = mime.split("/")[0]
            if kind not in ("image", "video", "audio"):
                raise bad_field(field, f"file.file_data: a {mime or 'untyped'} file; image/*, video/* and audio/* "
                                       "are accepted")
            if len(data) > limit:
                raise ProxyError(413, f"'{field}': {len(data)} bytes; at most {limit} are accepted", param=field,
                                 code="file_too_large")
        else:
            url, what = url_of(part, kind)
            data, kind = await media_bytes(url, field, allow_urls, limit, what), URL_KEYS[kind]
        media.setdefault(kind, []).append(data)
        parts.append({"type": kind})
    return parts, chars
