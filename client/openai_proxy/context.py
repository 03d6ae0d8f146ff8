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
    api_key: str | None = None
    max_body_bytes: int = 32 << 20          # 413 above this
    voices_dir: Path | None = None          # uploaded voices survive restarts when set
    request_timeout_s: float = 600.0
    max_video_jobs: int = 64                # finished jobs kept for download (oldest dropped first)


@dataclass
class Proxy:
    settings: Settings
    gateway: TritonGateway
    models: ModelTable
    voices: object = None
    videos: object = None


def proxy_of(request: Request) -> Proxy:
    return request.app.state.proxy
