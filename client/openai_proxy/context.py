"""What every handler needs: settings, the Triton gateway, the model table, stores; on `app.state.proxy`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from triton_omni.client.openai_proxy.models import ModelTable
from triton_omni.client.openai_proxy.triton import TritonGateway


@dataclass
class Settings:
    triton_url: str = "localhost:8001"
    api_keys: tuple[str, ...] = ()          # 'Authorization: Bearer KEY' with one of these; none: open
    max_body_bytes: int = 32 << 20          # 413 above this
    max_upload_bytes: int = 25 << 20        # 413 for an uploaded file above this (OpenAI's audio limit)
    max_text_chars: int = 1 << 20           # 400 for any text field longer, before any work on it
    rate_limit_per_minute: float = 0.0      # requests a minute per key (per client address without keys); 0: off
    rate_limit_burst: int | None = None     # requests at once before the rate applies (default: a minute's worth)
    cors_origins: tuple[str, ...] = ()      # origins browsers may call from ("*": any); none: no CORS headers
    voices_dir: Path | None = None          # uploaded voices survive restarts when set
    request_timeout_s: float = 600.0        # a whole Triton request (stream) ends with 504 past this
    max_video_jobs: int = 64                # video jobs kept (finished ones dropped oldest first); 429 when all run
    allow_media_urls: bool = False          # fetch http(s) image / video URLs of chat and embedding requests
    # /v1/realtime: the cascade's models when a session names none (None: the one model serving the route)
    realtime_chat_model: str | None = None
    realtime_transcription_model: str | None = None
    realtime_speech_model: str | None = None
    realtime_voice: str | None = None       # None: the speech model's default voice
    realtime_max_buffer_bytes: int = 16 << 20   # a session's input audio buffer (~5.8 min of 24 kHz PCM16)
    realtime_max_sessions: int = 64         # open at once; past it the handshake gets 429


@dataclass
class Proxy:
    settings: Settings
    gateway: TritonGateway
    models: ModelTable
    voices: object = None
    videos: object = None
    keys: object = None         # guards.KeyRing; None: no key needed
    limiter: object = None      # guards.RateLimiter; None: no rate limit
    realtime_sessions: int = 0  # open /v1/realtime sessions


def proxy_of(request: Request) -> Proxy:
    return request.app.state.proxy
