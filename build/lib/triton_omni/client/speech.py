"""Text to speech (route `speech`): a whole file, or raw PCM chunks as they are synthesized.

    audio = SpeechClient("localhost:8001").synthesize("my_tts", "Hello there.", response_format="wav")
    Path("hello.wav").write_bytes(audio.audio)
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

from triton_omni.client.tensors import first, text
from triton_omni.client.triton import responses

FORMATS = ("wav", "mp3", "opus", "flac", "pcm")


@dataclass
class SpeechAudio:
    audio: bytes                 # a whole file in `response_format`, or one chunk of s16le mono PCM
    sample_rate: int
    finish_reason: str | None


class SpeechClient:
    def __init__(self, url: str = "localhost:8001", timeout_s: float = 600.0):
        self.url = url
        self.timeout_s = timeout_s

    @staticmethod
    def values(text_in: str, voice: str | None = None, response_format: str = "wav", stream: bool = False,
               speed: float | None = None, sampling: dict[str, Any] | None = None,
               reference_audio: bytes | None = None, reference_text: str | None = None,
               instructions: str | None = None, language: str | None = None) -> dict:
        """The request tensors of the speech contract (ensemble_configs/README.md)."""
        if response_format not in FORMATS:
            raise ValueError(f"response_format must be one of {', '.join(FORMATS)}, got {response_format!r}")
        return {"text": (text_in, "BYTES"), "voice": (voice, "BYTES"), "response_format": (response_format, "BYTES"),
                "stream": (stream, "BOOL"), "speed": (speed, "FP32"), "sampling_parameters": (sampling, "BYTES"),
                "reference_audio": (reference_audio, "BYTES"), "reference_text": (reference_text, "BYTES"),
                "instructions": (instructions, "BYTES"), "language": (language, "BYTES")}

    def stream(self, model: str, text_in: str, **kwargs) -> Iterator[SpeechAudio]:
        """Raw PCM (s16le, mono) chunks as they are synthesized. Closing early cancels the request."""
        values = self.values(text_in, response_format="pcm", stream=True, **kwargs)
        with contextlib.closing(responses(self.url, model, values, self.timeout_s)) as replies:
            for outputs in replies:
                yield SpeechAudio(first(outputs, "audio", b""), int(first(outputs, "sample_rate", 0)),
                                  text(outputs, "finish_reason") or None)

    def synthesize(self, model: str, text_in: str, response_format: str = "wav", **kwargs) -> SpeechAudio:
        """The whole utterance as one file in `response_format`."""
        parts = list(responses(self.url, model, self.values(text_in, response_format=response_format, **kwargs),
                               self.timeout_s))
        if not parts:
            raise RuntimeError(f"{model}: no audio in the response")
        audio = b"".join(first(p, "audio", b"") for p in parts)
        return SpeechAudio(audio, int(first(parts[-1], "sample_rate", 0)), text(parts[-1], "finish_reason") or None)
