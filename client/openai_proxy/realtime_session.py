"""A realtime session's state: its configuration (session.update), the input audio buffer, the conversation.

The session names the three models of the cascade: `input_audio_transcription.model` (speech to text),
`model` (the chat model that answers) and `speech_model` (an extension: the text to speech model that
speaks the answer, in `voice`). Unset, each comes from the proxy's --realtime-* flags, else is the one
model that serves that route. Audio is PCM16 mono at the session's rates (24 kHz by default, as
OpenAI's): `input_audio_format` / `output_audio_format` are "pcm16", or {"type": "audio/pcm", "rate": N}
for another rate (the shape of OpenAI's newer API).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import uuid
import wave
from dataclasses import dataclass, field

DEFAULT_RATE = 24000
RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
MIN_COMMIT_MS = 100               # OpenAI's least audio a commit takes
MAX_INSTRUCTIONS_CHARS = 32768
MAX_OUTPUT_TOKENS = 4096
MAX_NAME_CHARS = 256


class EventError(Exception):
    """A client event the session refuses: sent back as an `error` event; the session goes on."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value",
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.type = message, param, code, type


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def check_text(value, param: str, max_chars: int | None = None) -> str:
    """A string that is valid Unicode (a lone surrogate, sent escaped, is not: no model could encode it)."""
    if not isinstance(value, str) or (max_chars is not None and len(value) > max_chars):
        limit = f" of at most {max_chars} characters" if max_chars is not None else ""
        raise EventError(f"'{param}': expected a string{limit}", param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise EventError(f"'{param}': not valid Unicode (a lone surrogate)", param) from None
    return value


def _name(value, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise EventError(f"'{param}': expected a name (a non-empty string of at most {MAX_NAME_CHARS} characters)",
                         param)
    return check_text(value, param)


def _rate(value, param: str) -> int:
    """'pcm16' (24 kHz) or {"type": "audio/pcm", "rate": N}."""
    if value == "pcm16":
        return DEFAULT_RATE
    if isinstance(value, dict) and value.get("type") in ("audio/pcm", "pcm16") and set(value) <= {"type", "rate"}:
        rate = value.get("rate", DEFAULT_RATE)
        if type(rate) is int and rate in RATES:
            return rate
        raise EventError(f"'{param}.rate': expected one of {', '.join(map(str, RATES))}", f"{param}.rate")
    raise EventError(f"'{param}': only PCM16 audio is supported: \"pcm16\" or {{\"type\": \"audio/pcm\", "
                     "\"rate\": N}", param)


def check_temperature(value, param: str) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 <= value <= 2:
        raise EventError(f"'{param}': expected a number in [0, 2]", param)
    return float(value)


def check_max_tokens(value, param: str) -> int | None:
    if value is None or value == "inf":
        return None
    if type(value) is not int or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise EventError(f"'{param}': expected an integer in [1, {MAX_OUTPUT_TOKENS}] or \"inf\"", param)
    return value


def check_modalities(value, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not set(value) <= {"text", "audio"}:
        raise EventError(f"'{param}': expected [\"text\"] or [\"text\", \"audio\"]", param)
    return ("text", "audio") if "audio" in value else ("text",)


@dataclass
class SessionConfig:
    model: str | None = None                 # chat
    transcription_model: str | None = None   # speech to text
    speech_model: str | None = None          # text to speech
    voice: str | None = None                 # the speech model's voice (None: its default)
    language: str | None = None              # of the input speech (given to the transcription model)
    instructions: str = ""
    modalities: tuple[str, ...] = ("text", "audio")
    input_rate: int = DEFAULT_RATE
    output_rate: int = DEFAULT_RATE
    temperature: float | None = None         # None: the chat model's default
    max_output_tokens: int | None = None     # None: "inf" (the chat model's own limit)
    id: str = field(default_factory=lambda: new_id("sess"))

    def update(self, session, buffered: bool) -> None:
        """Apply a session.update's `session` object; nothing changes when a field is refused."""
        if not isinstance(session, dict):
            raise EventError("'session': expected an object", "session")
        changes = {}
        for key, value in session.items():
            param = f"session.{key}"
            if key in ("id", "object", "type"):          # echoed back by clients; "type": "realtime" (newer API)
                continue
            if key in ("model", "speech_model", "voice"):
                changes[key] = _name(value, param)
            elif key == "input_audio_transcription":
                if value is not None and (not isinstance(value, dict) or not set(value) <= {"model", "language",
                                                                                         "prompt"}):
                    raise EventError(f"'{param}': expected {{\"model\": NAME, \"language\": CODE}}", param)
                if value is not None and value.get("prompt"):
                    raise EventError(f"'{param}.prompt': not supported by this server", f"{param}.prompt")
                value = value or {}
                changes["transcription_model"] = _name(value.get("model"), f"{param}.model")
                changes["language"] = _name(value.get("language"), f"{param}.language")
            elif key == "instructions":
                changes["instructions"] = check_text(value, param, MAX_INSTRUCTIONS_CHARS)
            elif key == "modalities":
                changes["modalities"] = check_modalities(value, param)
            elif key == "input_audio_format":
                rate = _rate(value, param)
                if buffered and rate != self.input_rate:
                    raise EventError(f"'{param}': the input audio buffer holds audio at {self.input_rate} Hz; commit "
                                     "or clear it first", param)
                changes["input_rate"] = rate
            elif key == "output_audio_format":
                changes["output_rate"] = _rate(value, param)
            elif key == "temperature":
                changes["temperature"] = check_temperature(value, param)
            elif key == "max_response_output_tokens":
                changes["max_output_tokens"] = check_max_tokens(value, param)
            elif key == "turn_detection":
                if value is not None:
                    raise EventError(f"'{param}': only null (turns are committed by the client: "
                                     "input_audio_buffer.commit, then response.create)", param, "unsupported")
            elif key in ("tools", "input_audio_noise_reduction"):
                if value not in (None, []):
                    raise EventError(f"'{param}': not supported by this server", param, "unsupported")
            elif key == "tool_choice":
                if value not in ("auto", "none"):
                    raise EventError(f"'{param}': not supported by this server", param, "unsupported")
            else:
                raise EventError(f"'{param}': unknown session field", param, "unknown_parameter")
        for key, value in changes.items():
            setattr(self, key, value)

    def public(self, resolved: dict[str, str | None]) -> dict:
        """The session object of session.created / session.updated (`resolved`: the models it uses)."""
        return {"id": self.id, "object": "realtime.session", "model": resolved.get("chat"),
                "modalities": list(self.modalities), "instructions": self.instructions, "voice": self.voice,
                "speech_model": resolved.get("speech"),
                "input_audio_format": "pcm16", "output_audio_format": "pcm16",
                "input_audio_sample_rate": self.input_rate, "output_audio_sample_rate": self.output_rate,
                "input_audio_transcription": {"model": resolved.get("transcription"), "language": self.language},
                "turn_detection": None, "tools": [], "tool_choice": "auto", "temperature": self.temperature,
                "max_response_output_tokens": self.max_output_tokens or "inf"}


def decode_pcm(audio, param: str) -> bytes:
    """Base64 PCM16 mono -> its bytes."""
    if not isinstance(audio, str):
        raise EventError(f"'{param}': expected base64-encoded PCM16 audio", param)
    try:
        pcm = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise EventError(f"'{param}': not valid base64", param) from None
    if len(pcm) % 2:
        raise EventError(f"'{param}': PCM16 audio has an even number of bytes, got {len(pcm)}", param)
    return pcm


class AudioBuffer:
    """The input audio buffer: PCM16 appended until committed or cleared, at most `limit` bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        self.pcm = bytearray()

    def append(self, pcm: bytes) -> None:
        if len(self.pcm) + len(pcm) > self.limit:
            raise EventError(f"the input audio buffer would hold {len(self.pcm) + len(pcm)} bytes; at most "
                             f"{self.limit} are accepted (the proxy's --realtime-max-buffer-bytes): commit or clear "
                             "it first", "audio", "input_audio_buffer_too_large")
        self.pcm += pcm

    def take(self, rate: int) -> bytes:
        """The buffer's audio (emptied), refused when shorter than MIN_COMMIT_MS."""
        have_ms = len(self.pcm) / 2 / rate * 1000
        if have_ms < MIN_COMMIT_MS:
            raise EventError(f"buffer too small: expected at least {MIN_COMMIT_MS} ms of audio, but the buffer "
                             f"holds {have_ms:.2f} ms", None, "input_audio_buffer_commit_empty")
        pcm, self.pcm = bytes(self.pcm), bytearray()
        return pcm


def wav_of(pcm: bytes, rate: int) -> bytes:
    """PCM16 mono as a WAV file: what a transcription model takes (it decodes and resamples any file)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return out.getvalue()


@dataclass
class Item:
    """A conversation item: a message with its text (a user's audio: its transcript, once made)."""
    id: str
    role: str                   # user, assistant, system
    kind: str                   # input_text, input_audio, text, audio
    text: str | None = None
    status: str = "completed"
    transcribed: asyncio.Future | None = None      # an audio item's transcription, until done

    def public(self) -> dict:
        key = "transcript" if self.kind in ("input_audio", "audio") else "text"
        return {"id": self.id, "object": "realtime.item", "type": "message", "status": self.status, "role": self.role,
                "content": [{"type": self.kind, key: self.text}]}


class Conversation:
    """The session's items in order; the chat model gets them all as its messages."""

    def __init__(self, max_chars: int):
        self.items: list[Item] = []
        self.max_chars = max_chars

    def add(self, item: Item, previous_item_id: str | None = None, where: str = "previous_item_id") -> str | None:
        """Insert `item` after `previous_item_id` (None: at the end; "root": first); returns its predecessor's id."""
        if previous_item_id is None:
            at = len(self.items)
        elif previous_item_id == "root":
            at = 0
        else:
            at = next((i + 1 for i, it in enumerate(self.items) if it.id == previous_item_id), None)
            if at is None:
                raise EventError(f"'{where}': no item {previous_item_id[:80]!r} in the conversation", where,
                                 "item_not_found")
        if any(it.id == item.id for it in self.items):
            raise EventError(f"'item.id': the conversation already has an item {item.id[:80]!r}", "item.id",
                             "item_exists")
        chars = sum(len(it.text or "") for it in self.items) + len(item.text or "")
        if chars > self.max_chars:
            raise EventError(f"the conversation would hold more than {self.max_chars} characters of text (the proxy's "
                             "--max-text-chars)", "item", "conversation_too_long")
        self.items.insert(at, item)
        return self.items[at - 1].id if at > 0 else None

    def has_user_input(self) -> bool:
        return any(it.role == "user" for it in self.items)

    async def messages(self, instructions: str) -> list[dict]:
        """The chat model's messages: the instructions as the system message, then every item's text
        (waiting for transcriptions still running)."""
        pending = [it.transcribed for it in self.items if it.transcribed is not None and not it.transcribed.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        out = [{"role": "system", "content": instructions}] if instructions else []
        return out + [{"role": it.role, "content": it.text or ""} for it in self.items]
