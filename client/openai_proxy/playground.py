"""`GET /playground`: one page of plain HTML and JavaScript (no build step) that calls the proxy's own
routes from the browser: chat (streamed), speech (played as it streams), image generation and
editing, and video with its progress. The page needs no key; the calls it makes send the key typed
into it, as any client's would."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from triton_omni.client.openai_proxy.errors import ProxyError

router = APIRouter()
FOLDER = Path(__file__).resolve().parent / "playground"
FILES = {"index.html": "text/html; charset=utf-8", "playground.js": "text/javascript; charset=utf-8",
         "playground.css": "text/css; charset=utf-8"}


@router.get("/playground", include_in_schema=False)
async def page():
    return FileResponse(FOLDER / "index.html", media_type=FILES["index.html"])


@router.get("/playground/{name}", include_in_schema=False)
async def asset(name: str):
    if name not in FILES:
        raise ProxyError(404, f"no playground file {name!r}", code="not_found")
    return FileResponse(FOLDER / name, media_type=FILES[name])
