"""Speech to text (route `transcription`): encoded audio in (wav, mp3, flac, ...), text out."""
from __future__ import annotations

from triton_omni.client.tensors import text
from triton_omni.client.triton import responses


class TranscribeClient:
    def __init__(self, url: str = "localhost:8001", timeout_s: float = 600.0):
        self.url = url
        self.timeout_s = timeout_s

    def transcribe(self, model: str, audio: bytes, language: str | None = None) -> str:
        values = {"audio": (audio, "BYTES"), "language": (language, "BYTES")}
        return "".join(text(o, "text") for o in responses(self.url, model, values, self.timeout_s))
