"""The fields of an image request (OpenAI `image_generation` route), checked and filled in.

Everything a client can get wrong is caught here, in the first (CPU) step, with the field named,
so no bad request reaches a GPU step. Sizes snap down to the model's multiple (VAE factor x patch),
as the diffusers pipelines do; a size that snaps to nothing, or is too large, is refused.
"""
from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request

FORMATS = {"png": "png", "jpeg": "jpeg", "jpg": "jpeg", "webp": "webp"}
SEED_MAX = 2**63 - 1

_SIZE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


@dataclass
class ServedSizes:
    """The largest request a model serves. Every step of an image model declares these (an ensemble's
    shared `parameters:` set them for all its steps at once), so a step called directly, not only
    through the pre step that checks a client's request, refuses more work than that."""

    max_steps: int = 100                  # denoise steps
    max_images: int = 4                   # output images per request
    max_side: int = 4096                  # pixels along either side of an output image
    max_pixels: int = 4 * 1024 * 1024     # pixels of one output image


@dataclass
class ImageLimits(ServedSizes):
    """Defaults and bounds of a model's requests (fields of its first step's Params)."""

    default_size: str = "1024x1024"
    default_steps: int = 50
    default_guidance: float = 4.0
    max_guidance: float = 100.0
    max_prompt_chars: int = 65536         # a longer prompt is refused before it is tokenized


@dataclass
class ImageRequest:
    prompt: str
    negative_prompt: str
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    n: int
    output_format: str


def parse_size(text: str, multiple: int, limits: ImageLimits) -> tuple[int, int]:
    """'WxH' -> (width, height), each snapped down to `multiple`."""
    if text.strip().lower() == "auto":
        text = limits.default_size
    m = _SIZE.match(text)
    if m is None:
        raise InvalidInput("size", f"expected WIDTHxHEIGHT in pixels, e.g. '1024x1024'; got {text!r}")
    w, h = int(m.group(1)), int(m.group(2))
    if w <= 0 or h <= 0:
        raise InvalidInput("size", f"width and height must be positive; got {w}x{h}")
    if w > limits.max_side or h > limits.max_side:
        raise InvalidInput("size", f"{w}x{h} exceeds the largest side this model serves ({limits.max_side} px)")
    if w * h > limits.max_pixels:
        raise InvalidInput("size", f"{w}x{h} is {w * h} pixels; this model serves at most {limits.max_pixels}")
    sw, sh = w // multiple * multiple, h // multiple * multiple
    if sw == 0 or sh == 0:
        raise InvalidInput("size", f"{w}x{h} is below the smallest size {multiple}x{multiple} "
                                   f"(sizes snap down to multiples of {multiple})")
    return sw, sh


def _int(req: Request, name: str, default: int, low: int, high: int) -> int:
    value = req.scalar(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(name, f"expected an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidInput(name, f"must be between {low} and {high}, got {value}")
    return value


def parse_request(req: Request, multiple: int, limits: ImageLimits) -> ImageRequest:
    prompt = req.string("prompt")
    if prompt is None or not prompt.strip():
        raise InvalidInput("prompt", "is required and must not be empty")
    negative = req.string("negative_prompt", "") or ""
    for name, text in (("prompt", prompt), ("negative_prompt", negative)):
        if len(text) > limits.max_prompt_chars:
            raise InvalidInput(name, f"{len(text)} characters; at most {limits.max_prompt_chars} are accepted")
    width, height = parse_size(req.string("size", "") or limits.default_size, multiple, limits)
    steps = _int(req, "num_inference_steps", limits.default_steps, 1, limits.max_steps)
    guidance = req.scalar("guidance_scale")
    guidance = limits.default_guidance if guidance is None else float(guidance)
    if not math.isfinite(guidance) or not 0.0 <= guidance <= limits.max_guidance:
        raise InvalidInput("guidance_scale", f"must be a number between 0 and {limits.max_guidance}, got {guidance}")
    seed = _int(req, "seed", secrets.randbelow(2**31), 0, SEED_MAX)   # no seed: a fresh one
    n = _int(req, "n", 1, 1, limits.max_images)
    fmt = (req.string("output_format", "") or "png").strip().lower()
    if fmt not in FORMATS:
        raise InvalidInput("output_format", f"expected one of png, jpeg, webp; got {fmt!r}")
    return ImageRequest(prompt, negative, width, height, steps, guidance, seed, n, FORMATS[fmt])
