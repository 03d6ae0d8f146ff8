"""Server-sent events: `data: <json>` frames, and a response that streams them."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

from fastapi.responses import StreamingResponse

DONE = b"data: [DONE]\n\n"


def event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def sse_response(frames: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> StreamingResponse:
    # no-cache and no proxy buffering: each frame must reach the client when it is made
    return StreamingResponse(frames, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
