"""POST /v1/embeddings onto an `embeddings` model: text (a text embedder's `text` input) or video (a video
encoder's `video` input), one Triton request per input item, sent together so the server batches them.

`input`: a string or a list of them; for a video model each item is a video, as a base64 data: URL
string or {"type": "video_url", "video_url": {"url": ...}} (http(s) URLs with --allow-media-urls).
`encoding_format` float or base64 (little-endian float32, what the SDK asks for by default).
Extensions: `num_frames` (frames sampled from each video), `patch_embeddings: true` (each item also
gets `patch_embeddings`, one vector per patch: V-JEPA2's tubelets). Token-id inputs and `dimensions`
are refused (no model here is trained for either).
"""
from __future__ import annotations

import asyncio
import base64

import numpy as np
from fastapi import APIRouter, Request

from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import bad_field, missing
from triton_omni.client.openai_proxy.fields import INT32_MAX, json_body
from triton_omni.client.openai_proxy.media import media_bytes, url_of
from triton_omni.client.tensors import first

router = APIRouter()
MAX_INPUTS = 2048              # OpenAI's limit
CONCURRENT = 64                # requests in flight to Triton for one call


def vector(values: np.ndarray, fmt: str):
    values = np.asarray(values, dtype="<f4")
    return base64.b64encode(values.tobytes()).decode() if fmt == "base64" else values.tolist()


async def item_values(model, item, where: str, settings, num_frames) -> dict:
    if "video" in model.inputs:
        url, what = item, ""
        if isinstance(item, dict):
            if item.get("type") != "video_url":
                raise bad_field(where, f"expected a video (a data: URL or a video_url part), got a {item.get('type')!r} part")
            url, what = url_of(item, "video_url")
        data = await media_bytes(url, where, settings.allow_media_urls, settings.max_upload_bytes, what)
        return {"video": (data, "BYTES"), "num_frames": (num_frames, "INT32")}
    if not isinstance(item, str):
        raise bad_field(where, "expected a string (token-id inputs are not supported)")
    if not item:
        raise bad_field(where, "is empty")
    return {"text": (item, "BYTES")}


@router.post("/v1/embeddings")
async def embeddings(request: Request):
    proxy = proxy_of(request)
    body = await json_body(request)
    raw = body.raw("input")
    if raw is None:
        raise missing("input")
    items = raw if isinstance(raw, list) else [raw]
    if not items or len(items) > MAX_INPUTS:
        raise bad_field("input", f"expected 1 to {MAX_INPUTS} inputs, got {len(items)}")
    fmt = body.string("encoding_format", choices=("float", "base64"), default="float")
    if body.has("dimensions"):
        raise bad_field("dimensions", "not supported: the embeddings have the model's own size")
    num_frames = body.number("num_frames", lo=1, hi=INT32_MAX, integer=True)
    patches = body.boolean("patch_embeddings", default=False)
    model = await proxy.models.resolve("embeddings", body.string("model"))
    if (num_frames is not None or patches) and "video" not in model.inputs:
        raise bad_field("num_frames" if num_frames is not None else "patch_embeddings",
                        f"only for video models; '{model.name}' embeds text")
    where = [f"input[{i}]" if isinstance(raw, list) else "input" for i in range(len(items))]
    values = [await item_values(model, item, w, proxy.settings, num_frames) for item, w in zip(items, where)]
    gate = asyncio.Semaphore(CONCURRENT)

    async def one(v, w):
        async with gate:
            return await proxy.gateway.collect(model.name, v, request.is_disconnected,
                                               lambda f, w=w: w if f in ("text", "video") else f, model.batched)

    answers = await asyncio.gather(*(one(v, w) for v, w in zip(values, where)))
    data, tokens = [], 0
    for i, replies in enumerate(answers):
        outputs = replies[-1] if replies else {}
        entry = {"object": "embedding", "index": i, "embedding": vector(outputs.get("embedding", []), fmt)}
        if patches:
            entry["patch_embeddings"] = [vector(row, fmt) for row in outputs.get("patch_embeddings", [])]
        data.append(entry)
        tokens += int(first(outputs, "prompt_tokens", 0))
    return {"object": "list", "data": data, "model": model.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
