"""/v1/images/generations (JSON) and /v1/images/edits (multipart) onto image models.

Images come back as `b64_json` (a URL would need the proxy to host files). Besides OpenAI's fields
(prompt, n, size, output_format) the diffusion knobs are accepted as extensions: negative_prompt,
num_inference_steps, guidance_scale, seed.
"""
from __future__ import annotations

import base64
import re
import time

from fastapi import APIRouter, Request

from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import bad_field
from triton_omni.client.openai_proxy.fields import INT32_MAX, INT64_MAX, Fields, form_body, json_body, shown
from triton_omni.client.tensors import items

router = APIRouter()
SIZE = re.compile(r"^[1-9][0-9]{0,5}x[1-9][0-9]{0,5}$")     # the model bounds it; this keeps it a number
OUTPUT_FORMATS = ("png", "jpeg", "webp")


def image_values(body: Fields) -> dict:
    """The request tensors shared by generation, edit and video."""
    prompt = body.string("prompt", required=True)
    if not prompt.strip():
        raise bad_field("prompt", "is empty")
    size = body.string("size")
    if size == "auto":
        size = None          # the model's default size
    if size is not None and not SIZE.match(size):
        raise bad_field("size", f"expected WIDTHxHEIGHT (e.g. 1024x1024) or 'auto', got {shown(size)}")
    return {"prompt": (prompt, "BYTES"), "negative_prompt": (body.string("negative_prompt"), "BYTES"),
            "size": (size, "BYTES"),
            "num_inference_steps": (body.number("num_inference_steps", lo=1, hi=INT32_MAX, integer=True), "INT32"),
            "guidance_scale": (body.number("guidance_scale", lo=0), "FP32"),
            "seed": (body.number("seed", lo=0, hi=INT64_MAX, integer=True), "INT64")}


def output_values(body: Fields) -> tuple[dict, str]:
    fmt = body.string("output_format", choices=OUTPUT_FORMATS, default="png")
    body.string("response_format", choices=("b64_json",))       # `url` is not offered
    n = body.number("n", lo=1, hi=10, integer=True)
    return {"n": (n, "INT32"), "output_format": (fmt, "BYTES")}, fmt


async def answer(request: Request, route: str, body: Fields, values: dict, fmt: str) -> dict:
    proxy = proxy_of(request)
    model = await proxy.models.resolve(route, body.string("model"))
    replies = await proxy.gateway.collect(model.name, values, request.is_disconnected)
    images = [data for outputs in replies for data in items(outputs, "images")]
    size = values["size"][0]
    return {"created": int(time.time()), "data": [{"b64_json": base64.b64encode(d).decode()} for d in images],
            "output_format": fmt, **({"size": size} if size else {})}


@router.post("/v1/images/generations")
async def generations(request: Request):
    body = await json_body(request)
    outputs, fmt = output_values(body)
    return await answer(request, "image_generation", body, {**image_values(body), **outputs}, fmt)


@router.post("/v1/images/edits")
async def edits(request: Request):
    form = await form_body(request)
    uploads = form.files("image", "image[]")
    if not uploads:
        raise bad_field("image", "at least one image file is required")
    if form.files("mask"):
        raise bad_field("mask", "masks are not supported; describe the edit in the prompt")
    images = []
    for name, upload in uploads:
        data = await upload.read()
        if not data:
            raise bad_field(name, "the uploaded file is empty")
        images.append(data)
    outputs, fmt = output_values(form)
    values = {**image_values(form), **outputs, "image": (images, "BYTES")}
    return await answer(request, "image_edit", form, values, fmt)
