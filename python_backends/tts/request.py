"""The speech route's inputs, validated once in a model's pre step (the OpenAI `speech` contract:
text, voice, response_format, stream, speed, sampling_parameters, reference_audio, reference_text).

What later steps need from the request travels as one small JSON tensor, `speech` (seed, format,
stream): a step after a streaming step only sees tensors that the streaming step itself emits with
each response (Triton ensembles pair tensors by response), so the talker passes it along.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from triton_omni.media.audio import RESPONSE_FORMATS
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, string_array

SPEECH_INPUTS = (
    TensorSpec("text", "TYPE_STRING", (1,), optional=True),
    TensorSpec("voice", "TYPE_STRING", (1,), optional=True),
    TensorSpec("response_format", "TYPE_STRING", (1,), optional=True),
    TensorSpec("stream", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("speed", "TYPE_FP32", (1,), optional=True),
    TensorSpec("sampling_parameters", "TYPE_STRING", (1,), optional=True),
    TensorSpec("reference_audio", "TYPE_STRING", (1,), optional=True),
    TensorSpec("reference_text", "TYPE_STRING", (1,), optional=True),
    TensorSpec("instructions", "TYPE_STRING", (1,), optional=True),   # how to speak (OpenAI's field)
    TensorSpec("language", "TYPE_STRING", (1,), optional=True),       # the text's language ("auto": the model's guess)
)
SPEECH = TensorSpec("speech", "TYPE_STRING", (1,))
# what the step before speech_post hands on: a chunk (or the whole) of a request's audio
AUDIO_CHUNK_OUTPUTS = (
    TensorSpec("waveform", "TYPE_FP32", (-1,)),
    TensorSpec("sample_rate", "TYPE_INT32", (1,)),
    TensorSpec("finish_reason", "TYPE_STRING", (1,)),
    SPEECH,
)
DEFAULT_FORMAT = "mp3"                 # as OpenAI's /v1/audio/speech
SPEED_RANGE = (0.25, 4.0)              # OpenAI's range


@dataclass
class Speech:
    """What the codec and post steps need to know about a request."""
    seed: int
    response_format: str = DEFAULT_FORMAT
    stream: bool = False
    # wall-clock time the request reached the model (set when a pre step writes the tensor): the post
    # step's time-to-first-audio and real-time-factor metrics count from it
    arrival: float = field(default=0.0, compare=False)

    def tensor(self) -> np.ndarray:
        return string_array(json.dumps({**asdict(self), "arrival": self.arrival or time.time()}))

    @classmethod
    def from_request(cls, req: Request) -> "Speech":
        """The `speech` tensor a pre step wrote, checked (any step can be called directly)."""
        raw = req.json("speech", {})
        if not isinstance(raw, dict) or not set(raw) <= {"seed", "response_format", "stream", "arrival"}:
            raise InvalidInput("speech", "expected a JSON object of seed, response_format, stream and arrival")
        seed = check_seed("speech.seed", raw.get("seed"))
        fmt, stream = raw.get("response_format", DEFAULT_FORMAT), raw.get("stream", False)
        arrival = raw.get("arrival", 0.0)
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not 0 <= arrival < 1e11:
            raise InvalidInput("speech.arrival", f"expected seconds since the epoch, got {arrival!r}")
        if fmt not in RESPONSE_FORMATS:
            raise InvalidInput("speech.response_format", f"expected one of {', '.join(RESPONSE_FORMATS)}, got {fmt!r}")
        if not isinstance(stream, bool):
            raise InvalidInput("speech.stream", f"expected true or false, got {stream!r}")
        return cls(seed, fmt, stream, float(arrival))


def speech_tensor(req: Request) -> np.ndarray:
    """A talker's `speech` input, checked, to pass along to its codec (seed 0 when absent: a talker
    called on its own)."""
    if req.get("speech") is None:
        return Speech(seed=0).tensor()
    Speech.from_request(req)
    return req.get("speech").reshape(1)


def check_seed(name: str, seed) -> int:
    """A seed as the samplers and torch generators take it: an integer of 64 bits (signed)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not -2 ** 63 <= seed < 2 ** 63:
        raise InvalidInput(name, f"expected an integer of 64 bits (signed), got {seed!r}")
    return seed


def request_seed(raw: dict) -> int:
    """`sampling_parameters.seed` of a model that samples with torch generators: in [0, 2^63), drawn
    here when absent (so a seeded request gets the same audio streamed or not)."""
    seed = raw.get("seed")
    if seed is None:
        return random.randrange(2 ** 31)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
        raise InvalidInput("sampling_parameters.seed", f"expected an integer in [0, 2^63), got {seed!r}")
    return seed


@dataclass
class SpeechInput:
    text: str
    voice: str
    response_format: str
    stream: bool
    speed: float
    language: str = ""              # one of the model's languages, lower case; "" when not given
    instructions: str = ""


def parse_speech(req: Request, voices: list[str], default_voice: str, max_text_chars: int,
                 speeds: tuple[float, float] = (1.0, 1.0), languages: list[str] = (),
                 instructions: bool = False) -> SpeechInput:
    """The common speech inputs, checked. `speeds`: the range this model can speak at. No `voices`: a
    model that only clones voices (`voice` must then be left out; the returned voice is "").
    `languages`: the language names the model takes (none: `language` is refused, not ignored);
    `instructions`: whether it takes instructions (if not, they are refused)."""
    text = req.string("text")
    if text is None or not text.strip():
        raise InvalidInput("text", "is empty")
    if len(text) > max_text_chars:
        raise InvalidInput("text", f"is too long: {len(text)} characters; at most {max_text_chars}")
    voice = (req.string("voice") or "").strip() or default_voice
    if not voices and voice:
        raise InvalidInput("voice", f"this model has no preset voices (got {voice!r}); it clones the voice of "
                                    "reference_audio")
    if voices and voice not in voices:
        raise InvalidInput("voice", f"unknown voice {voice!r}; known: {', '.join(voices)}")
    fmt = (req.string("response_format") or "").strip().lower() or DEFAULT_FORMAT
    if fmt not in RESPONSE_FORMATS:
        raise InvalidInput("response_format", f"expected one of {', '.join(RESPONSE_FORMATS)}, got {fmt!r}")
    speed = float(req.scalar("speed", 1.0))
    if not SPEED_RANGE[0] <= speed <= SPEED_RANGE[1]:
        raise InvalidInput("speed", f"must be in [{SPEED_RANGE[0]}, {SPEED_RANGE[1]}], got {speed}")
    if not speeds[0] <= speed <= speeds[1]:
        raise InvalidInput("speed", f"this model speaks at {speeds[0]}" if speeds[0] == speeds[1]
                           else f"this model speaks at speeds in [{speeds[0]}, {speeds[1]}]")
    language = (req.string("language") or "").strip().lower()
    if language and not languages:
        raise InvalidInput("language", f"this model takes no language choice (got {language!r})")
    if language and language not in [x.lower() for x in languages]:
        raise InvalidInput("language", f"unknown language {language!r}; known: {', '.join(languages)}")
    instruct = (req.string("instructions") or "").strip()
    if instruct and not instructions:
        raise InvalidInput("instructions", "this model takes no instructions")
    if len(instruct) > max_text_chars:
        raise InvalidInput("instructions", f"is too long: {len(instruct)} characters; at most {max_text_chars}")
    return SpeechInput(text, voice, fmt, bool(req.scalar("stream", False)), speed, language, instruct)


def parse_reference(req: Request, rate: int, min_seconds: float, max_seconds: float) -> tuple[np.ndarray, str]:
    """A voice-cloning model's reference: `reference_audio` (the bytes of an audio file PyAV reads: WAV,
    FLAC, MP3, ...) as a mono float waveform at `rate`, and `reference_text` (its transcript; "" if none)."""
    wave, _ = reference_clip(req, rate, min_seconds, max_seconds)
    return wave, reference_transcript(req)


def reference_transcript(req: Request) -> str:
    """`reference_text`, the reference clip's transcript, stripped ("" if none)."""
    return (req.string("reference_text") or "").strip()


def reference_clip(req: Request, rate: int | None, min_seconds: float, max_seconds: float) -> tuple[np.ndarray, int]:
    """`reference_audio` decoded to a mono float waveform at `rate` (None: the file's own), checked;
    (waveform, its rate)."""
    from triton_omni.media.audio import decode

    data = reference_bytes(req)
    if not data:
        raise InvalidInput("reference_audio", "is required: this model clones the voice of a reference clip")
    try:
        wave, rate = decode(data, rate)
    except ValueError as exc:
        raise InvalidInput("reference_audio", str(exc)) from None
    seconds = wave.size / rate
    if seconds < min_seconds:
        raise InvalidInput("reference_audio", f"is too short: {seconds:.2f} s; at least {min_seconds} s")
    if seconds > max_seconds:
        raise InvalidInput("reference_audio", f"is too long: {seconds:.1f} s; at most {max_seconds} s")
    if not np.isfinite(wave).all():
        raise InvalidInput("reference_audio", "has samples that are not finite numbers")
    return wave, rate


def read_reference(req: Request, rate: int, min_seconds: float, max_seconds: float, max_text_chars: int,
                   why_transcript: str):
    """(clip [S] as a float32 tensor at `rate`, transcript), as Fish S2 and OmniVoice read theirs: decoded at
    the file's own rate, resampled with torchaudio's kernel (media.audio_signal.resample; FFmpeg's gives other
    samples); the transcript is required, `why_transcript` says why."""
    import torch

    from triton_omni.media.audio_signal import resample

    wave, own = reference_clip(req, None, min_seconds, max_seconds)      # one decode, at the file's rate
    transcript = reference_transcript(req)
    if not transcript:
        raise InvalidInput("reference_text", "is required with reference_audio: the transcript of the clip "
                                             f"({why_transcript})")
    if len(transcript) > max_text_chars:
        raise InvalidInput("reference_text", f"is too long: {len(transcript)} characters; at most {max_text_chars}")
    return resample(torch.from_numpy(wave), own, rate), transcript


def reference_bytes(req: Request) -> bytes:
    """The bytes of `reference_audio` (b"" when absent)."""
    value = req.get("reference_audio")
    data = value.reshape(-1)[0] if value is not None and value.size else b""
    return data.encode() if isinstance(data, str) else bytes(data or b"")


def has_value(req: Request, name: str) -> bool:
    value = req.get(name)
    return value is not None and any(len(v or b"") for v in value.reshape(-1))


def has_reference(req: Request) -> bool:
    """Either field given: the other one missing is then an error, not a reason to ignore it."""
    return any(has_value(req, name) for name in ("reference_audio", "reference_text"))


def reject_reference(req: Request, voices: list[str]) -> None:
    """For models without voice cloning: reference audio/text is an error, not silently ignored."""
    for name in ("reference_audio", "reference_text"):
        if has_value(req, name):
            raise InvalidInput(name, f"this model does not clone voices; choose a voice ({', '.join(voices)})")


def as_numpy(value) -> np.ndarray:
    """An input tensor as numpy: a GPU step may be handed torch tensors."""
    return value.cpu().numpy() if hasattr(value, "cpu") else np.asarray(value)
