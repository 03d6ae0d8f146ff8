"""Chat messages with images and videos: the content parts a vision-language pre step accepts.

OpenAI-style `messages` whose content is a string or a list of parts:
    {"type": "text", "text": "..."}
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}      (or "image_url": "data:...")
    {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}     (vLLM's extension)
    {"type": "file", "file": {"file_data": "data:video/mp4;base64,..."}}         (an image/* or video/* file)
    {"type": "image"} / {"type": "video"}   the next item of the request's `images` / `videos` tensor
                                            (raw encoded bytes: no base64; what the proxy sends)
Remote URLs are never fetched here (the proxy may fetch them, when started to, and send the bytes).
Media parts become {"type": "image"} / {"type": "video"} for the chat template; their bytes come out
in prompt order. Every error names the part: `messages[0].content[1].image_url`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_omni.media.data_url import decode_data_url  # noqa: F401 - moved there; importers here keep it
from triton_omni.runtime.errors import InvalidInput
from triton_omni.text.chat import ROLES

MEDIA_TYPES = {"image_url": "image", "video_url": "video", "image": "image", "video": "video", "file": None}
PART_TYPES = ("text", *MEDIA_TYPES)


@dataclass
class MediaPart:
    kind: str           # "image" or "video"
    data: bytes         # encoded (PNG, JPEG, MP4, ...)
    field: str          # where it came from, for errors: messages[0].content[1].image_url, images[0]


def _url(part: dict, key: str, field: str) -> str:
    value = part.get(key)
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise InvalidInput(f"{field}.{key}", "expected {'url': 'data:...'} or a data: URL string")
    return url


class MediaInputs:
    """The request's `images` and `videos` tensors, handed out in order to {"type": "image"} parts."""

    def __init__(self, images, videos):
        self.lists = {"image": self._items(images), "video": self._items(videos)}
        self.used = {"image": 0, "video": 0}

    @staticmethod
    def _items(value) -> list[bytes]:
        return [] if value is None else [bytes(v) for v in np.asarray(value, dtype=object).reshape(-1)]

    def take(self, kind: str, field: str) -> MediaPart:
        name = f"{kind}s"
        i = self.used[kind]
        if i >= len(self.lists[kind]):
            raise InvalidInput(field, f"a {kind} part with no {name}[{i}] in the request's '{name}' input")
        self.used[kind] += 1
        return MediaPart(kind, self.lists[kind][i], f"{name}[{i}]")

    def check_all_used(self) -> None:
        for kind, items in self.lists.items():
            if self.used[kind] != len(items):
                raise InvalidInput(f"{kind}s", f"{len(items)} given, {self.used[kind]} referenced by "
                                               f"{{'type': '{kind}'}} content parts")


def _part(part: Any, field: str, media: MediaInputs) -> tuple[dict, MediaPart | None]:
    if not isinstance(part, dict) or part.get("type") not in PART_TYPES:
        kind = part.get("type") if isinstance(part, dict) else None
        raise InvalidInput(field, f"unsupported content part {kind!r}; this model takes {', '.join(PART_TYPES)}")
    kind = part["type"]
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise InvalidInput(f"{field}.text", "expected a string")
        return {"type": "text", "text": part["text"]}, None
    if kind in ("image", "video") and not part.get(kind):
        m = media.take(kind, field)
        return {"type": kind}, m
    if kind == "file":
        f = part.get("file")
        data_url = f.get("file_data") if isinstance(f, dict) else None
        if not isinstance(data_url, str):
            raise InvalidInput(f"{field}.file", "expected {'file_data': 'data:<image or video type>;base64,...'}")
        mime, data = decode_data_url(data_url, f"{field}.file.file_data")
        kind = mime.split("/")[0]
        if kind not in ("image", "video"):
            raise InvalidInput(f"{field}.file.file_data", f"a {mime or 'untyped'} file; this model takes image/* and video/*")
        return {"type": kind}, MediaPart(kind, data, f"{field}.file")
    key = kind                  # image_url, video_url; or {"type": "image", "image": "data:..."}
    _, data = decode_data_url(_url(part, key, field), f"{field}.{key}")
    return {"type": MEDIA_TYPES[kind]}, MediaPart(MEDIA_TYPES[kind], data, f"{field}.{key}")


def parse_vision_messages(raw: Any, media: MediaInputs) -> tuple[list[dict], list[MediaPart]]:
    """Template-ready messages (content a string or a list of text / image / video parts) and the
    media, in prompt order."""
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("messages", "expected a non-empty JSON list of {role, content} objects")
    out, parts = [], []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidInput(f"messages[{i}]", "expected an object with 'role' and 'content'")
        if m.get("role") not in ROLES:
            raise InvalidInput(f"messages[{i}].role", f"expected one of {sorted(ROLES)}, got {m.get('role')!r}")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise InvalidInput(f"messages[{i}].content", "expected a string or a list of content parts")
        items = []
        for j, part in enumerate(content):
            item, found = _part(part, f"messages[{i}].content[{j}]", media)
            items.append(item)
            if found is not None:
                parts.append(found)
        out.append({"role": m["role"], "content": items})
    media.check_all_used()
    return out, parts
