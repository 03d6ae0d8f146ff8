"""Chat messages with audio: the content parts Qwen3-Omni's pre step accepts.

OpenAI-style `messages` whose content is a string or a list of parts:
    {"type": "text", "text": "..."}
    {"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav"}}    (OpenAI's audio input)
    {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,..."}}         (vLLM's extension)
    {"type": "file", "file": {"file_data": "data:audio/mpeg;base64,..."}}            (an audio/* file)
    {"type": "audio"}   the next item of the request's `audios` tensor (raw encoded bytes: what the proxy sends)
Remote URLs are never fetched here. Audio parts become {"type": "audio"} for the chat template; their bytes
come out in prompt order. Every error names the part: `messages[0].content[1].input_audio.data`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_omni.media.data_url import decode_base64, decode_data_url
from triton_omni.runtime.errors import InvalidInput
from triton_omni.text.chat import ROLES

PART_TYPES = ("text", "input_audio", "audio_url", "audio", "file")


@dataclass
class AudioPart:
    data: bytes         # encoded (WAV, FLAC, MP3, ...)
    field: str          # where it came from, for errors


class AudioInputs:
    """The request's `audios` tensor, handed out in order to {"type": "audio"} parts."""

    def __init__(self, audios):
        self.items = [] if audios is None else [bytes(v) for v in np.asarray(audios, dtype=object).reshape(-1)]
        self.used = 0

    def take(self, field: str) -> AudioPart:
        if self.used >= len(self.items):
            raise InvalidInput(field, f"an audio part with no audios[{self.used}] in the request's 'audios' input")
        self.used += 1
        return AudioPart(self.items[self.used - 1], f"audios[{self.used - 1}]")

    def check_all_used(self) -> None:
        if self.used != len(self.items):
            raise InvalidInput("audios", f"{len(self.items)} given, {self.used} referenced by {{'type': 'audio'}} "
                                         "content parts")


def _audio(part: dict, kind: str, field: str, audios: AudioInputs) -> AudioPart:
    if kind == "audio":
        return audios.take(field)
    if kind == "input_audio":
        spec = part.get("input_audio")
        if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
            raise InvalidInput(f"{field}.input_audio", "expected {'data': '<base64>', 'format': 'wav' | 'mp3' | ...}")
        return AudioPart(decode_base64(spec["data"], f"{field}.input_audio.data"), f"{field}.input_audio.data")
    if kind == "audio_url":
        value = part.get("audio_url")
        url = value.get("url") if isinstance(value, dict) else value
        if not isinstance(url, str):
            raise InvalidInput(f"{field}.audio_url", "expected {'url': 'data:...'} or a data: URL string")
        return AudioPart(decode_data_url(url, f"{field}.audio_url")[1], f"{field}.audio_url")
    f = part.get("file")
    data_url = f.get("file_data") if isinstance(f, dict) else None
    if not isinstance(data_url, str):
        raise InvalidInput(f"{field}.file", "expected {'file_data': 'data:audio/...;base64,...'}")
    mime, data = decode_data_url(data_url, f"{field}.file.file_data")
    if not mime.startswith("audio/"):
        raise InvalidInput(f"{field}.file.file_data", f"a {mime or 'untyped'} file; this model takes audio/*")
    return AudioPart(data, f"{field}.file.file_data")


def parse_audio_messages(raw: Any, audios: AudioInputs) -> tuple[list[dict], list[AudioPart]]:
    """Template-ready messages (content a string or a list of text / audio parts) and the audio, in prompt order."""
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("messages", "expected a non-empty JSON list of {role, content} objects")
    out, found = [], []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidInput(f"messages[{i}]", "expected an object with 'role' and 'content'")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidInput(f"messages[{i}].role", f"expected one of {sorted(ROLES)}, got {role!r}")
        content = m.get("content")
        if content is None:
            content = ""
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise InvalidInput(f"messages[{i}].content", "expected a string or a list of content parts")
        items = []
        for j, part in enumerate(content):
            field = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in PART_TYPES:
                raise InvalidInput(field, f"unsupported content part {kind!r}; this model takes {', '.join(PART_TYPES)}")
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    raise InvalidInput(f"{field}.text", "expected a string")
                items.append({"type": "text", "text": part["text"]})
                continue
            found.append(_audio(part, kind, field, audios))
            items.append({"type": "audio"})
        out.append({"role": role, "content": items})
    audios.check_all_used()
    return out, found
