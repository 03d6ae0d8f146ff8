"""Uploaded reference voices: audio + transcript stored once under a name, reused by `voice` in speech.

Kept in memory, and under `--voices-dir` when given (one `<id>.json` + `<id>.audio` per voice), so
uploads survive a restart. A speech request whose `voice` is an uploaded name or id is sent with
`reference_audio` (the upload's encoded bytes, as uploaded) and `reference_text` (its transcript).
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Voice:
    id: str
    name: str
    created_at: int
    transcript: str
    filename: str
    audio: bytes = b""

    def public(self) -> dict:
        """OpenAI's `audio.voice` object (plus the transcript, which is ours)."""
        return {"id": self.id, "object": "audio.voice", "name": self.name, "type": "audio_sample",
                "created_at": self.created_at, "transcript": self.transcript}


class VoiceStore:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder else None
        self.voices: dict[str, Voice] = {}
        self.lock = threading.Lock()
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            for meta in sorted(self.folder.glob("*.json")):
                fields = json.loads(meta.read_text())
                voice = Voice(**fields, audio=meta.with_suffix(".audio").read_bytes())
                self.voices[voice.id] = voice

    def add(self, name: str, audio: bytes, transcript: str, filename: str = "") -> Voice:
        """A new voice; a name already taken raises KeyError (delete that voice first)."""
        with self.lock:
            if self.find(name) is not None:
                raise KeyError(name)
            voice = Voice(f"voice_{uuid.uuid4().hex[:24]}", name, int(time.time()), transcript, filename, audio)
            if self.folder is not None:
                (self.folder / f"{voice.id}.audio").write_bytes(audio)
                meta = {k: v for k, v in asdict(voice).items() if k != "audio"}
                (self.folder / f"{voice.id}.json").write_text(json.dumps(meta))
            self.voices[voice.id] = voice
            return voice

    def find(self, key: str) -> Voice | None:
        """By id or by name."""
        if key in self.voices:
            return self.voices[key]
        return next((v for v in self.voices.values() if v.name == key), None)

    def delete(self, key: str) -> Voice | None:
        with self.lock:
            voice = self.find(key)
            if voice is None:
                return None
            del self.voices[voice.id]
            if self.folder is not None:
                for suffix in (".json", ".audio"):
                    (self.folder / f"{voice.id}{suffix}").unlink(missing_ok=True)
            return voice

    def all(self) -> list[Voice]:
        return sorted(self.voices.values(), key=lambda v: v.created_at)
