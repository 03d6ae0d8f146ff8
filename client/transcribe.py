"""Speech to text (route `transcription`): an audio file in (WAV, FLAC, MP3, Ogg/Opus, M4A/AAC, WebM, ...),
the transcript out, with segment (and word) times, in the formats OpenAI's transcription API answers in.

The model's outputs (ensemble_configs/README.md): `text`, `spoken_language`, `segments` and `words`
(JSON lists in OpenAI's verbose_json shapes) and `duration`. A model that streams sends its text in
pieces (one response each); a model that does not, like a CTC model, answers once.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from triton_omni.client.tensors import first, text
from triton_omni.client.triton import Outputs, responses

FORMATS = ("json", "text", "verbose_json", "srt", "vtt")


@dataclass
class Transcription:
    text: str = ""
    language: str = ""
    duration: float = 0.0
    segments: list[dict] = field(default_factory=list)
    words: list[dict] = field(default_factory=list)
    task: str = "transcribe"               # or "translate"

    @classmethod
    def from_responses(cls, replies: Iterable[Outputs]) -> "Transcription":
        """All of a request's responses: the texts joined, times and language from the last that has them."""
        out = cls()
        pieces = []
        for o in replies:
            pieces.append(text(o, "text"))
            out.language = text(o, "spoken_language", out.language)
            out.duration = float(first(o, "duration", out.duration))
            for name in ("segments", "words"):
                raw = text(o, name)
                if raw:
                    setattr(out, name, json.loads(raw))
        out.text = "".join(pieces)
        return out

    def usage(self) -> dict:
        """OpenAI's usage of a duration-billed transcription: whole seconds of audio."""
        return {"type": "duration", "seconds": math.ceil(self.duration)}

    def verbose(self, words: bool) -> dict:
        body = {"task": self.task, "language": self.language, "duration": self.duration, "text": self.text,
                "segments": self.segments}
        if words:
            body["words"] = self.words
        return {**body, "usage": self.usage()}

    def render(self, fmt: str, words: bool = False) -> str | dict:
        """The body OpenAI answers with for `response_format` fmt: a dict (json, verbose_json) or text."""
        if fmt == "json":
            return {"text": self.text, "usage": self.usage()}
        if fmt == "verbose_json":
            return self.verbose(words)
        if fmt == "text":
            return self.text
        if fmt == "srt":
            return srt(self.segments)
        if fmt == "vtt":
            return vtt(self.segments)
        raise ValueError(f"unknown response_format {fmt!r}; known: {', '.join(FORMATS)}")


def _clock(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(segments: list[dict]) -> str:
    """SubRip: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after each."""
    return "".join(f"{i}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n{s['text'].strip()}\n\n"
                   for i, s in enumerate(segments, 1))


def vtt(segments: list[dict]) -> str:
    """WebVTT: the header, then `HH:MM:SS.mmm --> HH:MM:SS.mmm` cues."""
    return "WEBVTT\n\n" + "".join(f"{_clock(s['start'], '.')} --> {_clock(s['end'], '.')}\n{s['text'].strip()}\n\n"
                                  for s in segments)


def request_values(audio: bytes, language: str | None = None, prompt: str | None = None,
                   temperature: float | None = None, words: bool = False, stream: bool = False,
                   translate: bool = False) -> dict:
    """The ensemble's inputs for one transcription (None: left out). `translate`: into English, by a
    model that translates (it has the `task` input)."""
    return {"audio": (audio, "BYTES"), "language": (language, "BYTES"), "prompt": (prompt, "BYTES"),
            "temperature": (temperature, "FP32"),
            "timestamp_granularities": ("segment,word" if words else None, "BYTES"),
            "stream": (True if stream else None, "BOOL"), "task": ("translate" if translate else None, "BYTES")}


class TranscribeClient:
    def __init__(self, url: str = "localhost:8001", timeout_s: float = 600.0):
        self.url = url
        self.timeout_s = timeout_s

    def responses(self, model: str, audio: bytes, **options) -> Iterator[Outputs]:
        return responses(self.url, model, request_values(audio, **options), self.timeout_s)

    def transcribe(self, model: str, audio: bytes, language: str | None = None, prompt: str | None = None,
                   temperature: float | None = None, words: bool = False, translate: bool = False) -> Transcription:
        result = Transcription.from_responses(self.responses(model, audio, language=language, prompt=prompt,
                                                             temperature=temperature, words=words, translate=translate))
        result.task = "translate" if translate else "transcribe"
        return result

    def stream(self, model: str, audio: bytes, **options) -> Iterator[str]:
        """The transcript's text as the model streams it, piece by piece."""
        for outputs in self.responses(model, audio, stream=True, **options):
            piece = text(outputs, "text")
            if piece:
                yield piece
