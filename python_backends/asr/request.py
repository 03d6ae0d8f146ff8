"""The transcription route's inputs, parsed and checked the same way for every speech-recognition model.

Inputs (one item each; all but `audio` optional): `audio` (the bytes of an audio file: WAV, FLAC, MP3,
Ogg/Opus, M4A/AAC, WebM, ...), `language` (a language code such as "en", "eng" or "eng_Latn"), `prompt`
(text that guides a model that reads one), `temperature` (0 = greedy), `timestamp_granularities`
("segment", "word", or both: a JSON list or comma-separated), `stream`. What a model cannot use it
refuses by name (a CTC model has no prompt and does not sample), so nothing is silently ignored.

The request's options travel to the post step as one JSON string, `transcription`.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

import numpy as np

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, string_array

RATE = 16000
GRANULARITIES = ("segment", "word")
LANGUAGE = re.compile(r"^[A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8}){0,2}$")     # en, eng, en-US, eng_Latn

INPUTS = (
    TensorSpec("audio", "TYPE_STRING", (1,)),
    TensorSpec("language", "TYPE_STRING", (1,), optional=True),
    TensorSpec("prompt", "TYPE_STRING", (1,), optional=True),
    TensorSpec("temperature", "TYPE_FP32", (1,), optional=True),
    TensorSpec("timestamp_granularities", "TYPE_STRING", (1,), optional=True),
    TensorSpec("stream", "TYPE_BOOL", (1,), optional=True),
)
TRANSCRIPTION = TensorSpec("transcription", "TYPE_STRING", (1,))      # Options, as JSON


@dataclass(frozen=True)
class Abilities:
    """What a model does with the optional inputs (from its pre step's parameters)."""

    prompt: bool = False
    sampling: bool = False           # temperature > 0
    max_prompt_chars: int = 2048
    translate: bool = False          # task "translate" (into English: the translation route)


@dataclass(frozen=True)
class Options:
    """What the steps after pre need to know of a request."""

    language: str = ""               # as given ("" = not given)
    prompt: str = ""
    temperature: float = 0.0
    words: bool = False              # word timestamps asked for
    stream: bool = False
    duration: float = 0.0            # seconds of audio
    task: str = "transcribe"         # or "translate" (a model that takes the `task` input)

    def tensor(self) -> np.ndarray:
        return string_array(json.dumps(asdict(self)))

    @classmethod
    def from_request(cls, req: Request) -> "Options":
        raw = req.json(TRANSCRIPTION.name)
        if not isinstance(raw, dict):
            raise InvalidInput(TRANSCRIPTION.name, "expected a JSON object (the transcription pre step makes it)")
        try:
            return cls(**raw)
        except TypeError as e:
            raise InvalidInput(TRANSCRIPTION.name, f"unexpected content: {e}") from None


def read_audio(req: Request, max_seconds: float, min_seconds: float) -> np.ndarray:
    """`audio` decoded to 16 kHz mono float32, within [min_seconds, max_seconds], finite."""
    from triton_omni.media.audio import decode

    value = req.get("audio")
    if value is None or value.size != 1:
        raise InvalidInput("audio", "expected the bytes of one audio file")
    data = value.reshape(-1)[0]
    data = data.encode("latin-1") if isinstance(data, str) else bytes(data)
    try:
        wave, _ = decode(data, RATE, max_seconds=max_seconds)
    except ValueError as e:
        raise InvalidInput("audio", str(e)) from None
    if wave.size == 0:
        raise InvalidInput("audio", "has no audio samples (an empty recording)")
    if wave.size < min_seconds * RATE:
        raise InvalidInput("audio", f"is too short: {wave.size / RATE:.3f} s; at least {min_seconds:g} s")
    if not np.isfinite(wave).all():
        raise InvalidInput("audio", "has samples that are not finite numbers")
    return wave


def parse_granularities(req: Request) -> bool:
    """Whether word timestamps are asked for (segments always come)."""
    text = (req.string("timestamp_granularities") or "").strip()
    if not text:
        return False
    try:
        items = json.loads(text) if text.startswith("[") else [t.strip() for t in text.split(",")]
    except json.JSONDecodeError as e:
        raise InvalidInput("timestamp_granularities", f"not valid JSON: {e.msg}") from None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise InvalidInput("timestamp_granularities", "expected a list of strings")
    for item in items:
        if item not in GRANULARITIES:
            raise InvalidInput("timestamp_granularities", f"unknown granularity {item[:40]!r}; expected "
                                                          f"{' or '.join(GRANULARITIES)}")
    return "word" in items


def parse_options(req: Request, abilities: Abilities, duration: float) -> Options:
    language = (req.string("language") or "").strip()
    if language and not LANGUAGE.match(language):
        raise InvalidInput("language", f"{language[:40]!r} is not a language code (e.g. 'en', 'eng', 'eng_Latn')")
    prompt = req.string("prompt") or ""
    if prompt.strip() and not abilities.prompt:
        raise InvalidInput("prompt", "this model takes no prompt (it transcribes the audio alone)")
    if len(prompt) > abilities.max_prompt_chars:
        raise InvalidInput("prompt", f"is too long: {len(prompt)} characters; at most {abilities.max_prompt_chars}")
    temperature = float(req.scalar("temperature", 0.0))
    if not np.isfinite(temperature) or not 0.0 <= temperature <= 1.0:
        raise InvalidInput("temperature", f"must be in [0, 1], got {temperature}")
    if temperature > 0 and not abilities.sampling:
        raise InvalidInput("temperature", "this model decodes greedily (CTC) and does not sample; "
                                          "leave it out or send 0")
    task = (req.string("task") or "transcribe").strip().lower()
    if task not in ("transcribe", "translate"):
        raise InvalidInput("task", f"expected transcribe or translate, got {task[:40]!r}")
    if task == "translate" and not abilities.translate:
        raise InvalidInput("task", "this model does not translate (it transcribes in the language spoken)")
    return Options(language, prompt, temperature, parse_granularities(req), bool(req.scalar("stream", False)),
                   round(duration, 3), task)
