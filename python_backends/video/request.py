"""The fields of a video request (OpenAI `video` route and its extensions), checked and filled in.

Everything a client can get wrong is caught here, in the first (CPU) step, with the field named, so
no bad request reaches a GPU step. Unlike the image models' sizes, which snap to the model's
multiple, a clip's size and frame count must be ones the model takes as they are (the VAE encodes
frames in groups of `temporal` after the first, and a size in whole latent patches); a wrong one is
refused with the nearest valid values named. `seconds` (OpenAI's field) is the one approximate
input: it becomes the nearest frame count the model takes at the request's fps.
"""
from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass
from typing import Optional

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request

SEED_MAX = 2**63 - 1
_SIZE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


@dataclass
class ServedClips:
    """The largest request a video model serves. Every step declares these (the ensemble's shared
    `parameters:` set them for all its steps at once), so a step called directly, not only through
    the pre step that checks a client's request, refuses more work than that."""

    max_steps: int = 100                  # denoise steps
    max_frames: int = 121                 # frames of one clip
    max_side: int = 1280                  # pixels along either side of a frame
    max_pixels: int = 1280 * 720          # pixels of one frame
    max_fps: int = 60


@dataclass
class VideoLimits(ServedClips):
    """Defaults and bounds of a model's requests (fields of its pre step's Params)."""

    default_size: str = "1280x704"
    default_frames: int = 121
    default_fps: int = 24
    default_steps: int = 50
    default_guidance: float = 5.0
    default_guidance_2: Optional[float] = None  # the A14B models' second expert; none: guidance_scale's
    max_guidance: float = 100.0
    max_prompt_chars: int = 65536         # a longer prompt is refused before it is tokenized
    max_image_pixels: int = 4096 * 4096   # an input image's pixels, checked from its header before decoding


@dataclass
class VideoRequest:
    prompt: str
    negative_prompt: str
    width: int
    height: int
    num_frames: int
    fps: int
    num_inference_steps: int
    guidance_scale: float
    guidance_scale_2: float              # the second (low-noise) expert's; = guidance_scale for one expert
    seed: int
    image: bytes | None                  # the encoded first frame, if the request gave one


def integer(req: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    value = req.scalar(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(name, f"expected an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidInput(name, f"must be between {low} and {high}, got {value}")
    return value


def number(req: Request, name: str, default: float | None, low: float, high: float) -> float | None:
    value = req.scalar(name)
    if value is None:
        return default
    value = float(value)
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidInput(name, f"must be a number between {low:g} and {high:g}, got {value}")
    return value


def check_size(width: int, height: int, multiple: int, sizes: ServedClips, field: str = "size") -> None:
    """Frame sides in pixels: positive multiples of `multiple`, within the largest frame served."""
    if width <= 0 or height <= 0:
        raise InvalidInput(field, f"width and height must be positive; got {width}x{height}")
    if width > sizes.max_side or height > sizes.max_side:
        raise InvalidInput(field, f"{width}x{height} exceeds the largest side this model serves ({sizes.max_side} px)")
    if width * height > sizes.max_pixels:
        raise InvalidInput(field, f"{width}x{height} is {width * height} pixels; this model serves at most "
                                  f"{sizes.max_pixels}")
    if width % multiple or height % multiple:
        near = [max(multiple, round(v / multiple) * multiple) for v in (width, height)]
        raise InvalidInput(field, f"{width}x{height}: this model takes sides that are multiples of {multiple} "
                                  f"(its VAE x patch size), e.g. {near[0]}x{near[1]}")


def check_frames(frames: int, temporal: int, sizes: ServedClips, field: str = "num_frames") -> None:
    """A frame count the VAE takes: 1 + a multiple of `temporal`, within the longest clip served."""
    if not 1 <= frames <= sizes.max_frames:
        raise InvalidInput(field, f"must be between 1 and {sizes.max_frames}, got {frames}")
    if (frames - 1) % temporal:
        low = (frames - 1) // temporal * temporal + 1
        raise InvalidInput(field, f"{frames} frames: this model takes 1 + a multiple of {temporal} "
                                  f"(e.g. {low} or {low + temporal})")


def parse_size(req: Request, limits: VideoLimits) -> tuple[int, int]:
    """`size` ("WxH") or `width` and `height`; the model's default size when neither is given."""
    text = req.string("size", "") or ""
    width = integer(req, "width", None, 1, 1 << 20)
    height = integer(req, "height", None, 1, 1 << 20)
    if (width is None) != (height is None):
        raise InvalidInput("width" if width is None else "height", "give width and height together (or size)")
    if text.strip() and text.strip().lower() != "auto":
        m = _SIZE.match(text)
        if m is None:
            raise InvalidInput("size", f"expected WIDTHxHEIGHT in pixels, e.g. '832x480'; got {text!r}")
        size = int(m.group(1)), int(m.group(2))
        if width is not None and (width, height) != size:
            raise InvalidInput("size", f"{text!r} disagrees with width {width} and height {height}")
        return size
    if width is not None:
        return width, height
    m = _SIZE.match(limits.default_size)
    return int(m.group(1)), int(m.group(2))


def parse_frames(req: Request, fps: int, temporal: int, limits: VideoLimits) -> int:
    """`num_frames`, or `seconds` at `fps` (the nearest count the VAE takes), or the default."""
    frames = integer(req, "num_frames", None, -(1 << 31), (1 << 31) - 1)
    seconds = number(req, "seconds", None, 0.0, 3600.0)
    if frames is not None and seconds is not None:
        raise InvalidInput("seconds", "give num_frames or seconds, not both")
    if frames is None and seconds is not None:
        if seconds <= 0:
            raise InvalidInput("seconds", f"must be above 0, got {seconds:g}")
        frames = 1 + max(0, round(seconds * fps / temporal)) * temporal
        if frames > limits.max_frames:
            raise InvalidInput("seconds", f"{seconds:g} s at {fps} fps is {frames} frames; this model serves at "
                                          f"most {limits.max_frames} ({(limits.max_frames - 1) / fps:.2f} s)")
    frames = limits.default_frames if frames is None else frames
    check_frames(frames, temporal, limits)
    return frames


def parse_request(req: Request, multiple: int, temporal: int, limits: VideoLimits, experts: int) -> VideoRequest:
    """The request's fields checked for a model whose frame sides are multiples of `multiple`, whose
    clips are 1 + k x `temporal` frames, and that has `experts` denoising transformers (A14B: 2)."""
    prompt = req.string("prompt")
    if prompt is None or not prompt.strip():
        raise InvalidInput("prompt", "is required and must not be empty")
    negative = req.string("negative_prompt", "") or ""
    for name, text in (("prompt", prompt), ("negative_prompt", negative)):
        if len(text) > limits.max_prompt_chars:
            raise InvalidInput(name, f"{len(text)} characters; at most {limits.max_prompt_chars} are accepted")
    width, height = parse_size(req, limits)
    check_size(width, height, multiple, limits)
    fps = integer(req, "fps", limits.default_fps, 1, limits.max_fps)
    frames = parse_frames(req, fps, temporal, limits)
    steps = integer(req, "num_inference_steps", limits.default_steps, 1, limits.max_steps)
    guidance = number(req, "guidance_scale", limits.default_guidance, 0.0, limits.max_guidance)
    guidance_2 = number(req, "guidance_scale_2", None, 0.0, limits.max_guidance)
    if guidance_2 is not None and experts < 2:
        raise InvalidInput("guidance_scale_2", "this model has one denoising transformer; guidance_scale_2 is "
                                               "the second (low-noise) expert's scale of the A14B models")
    seed = integer(req, "seed", secrets.randbelow(2**31), 0, SEED_MAX)      # no seed: a fresh one
    image = req.get("image")
    data = None
    if image is not None and image.size:
        if image.size != 1:
            raise InvalidInput("image", f"expected one encoded image, got {image.size}")
        data = bytes(image.reshape(-1)[0])
    if guidance_2 is None:
        guidance_2 = guidance if limits.default_guidance_2 is None else limits.default_guidance_2
    return VideoRequest(prompt, negative, width, height, frames, fps, steps, guidance, guidance_2, seed, data or None)


def check_settings(req: Request, multiple: int, temporal: int, sizes: ServedClips) -> dict:
    """The settings a pre step hands the GPU steps, checked again for a step called directly: width,
    height, num_frames, fps, num_inference_steps, guidance_scale, guidance_scale_2, seed (those given)."""
    values = {name: req.scalar(name) for name in ("width", "height", "num_frames", "fps", "num_inference_steps",
                                                  "guidance_scale", "guidance_scale_2", "seed")}
    values = {k: v for k, v in values.items() if v is not None}
    if "width" in values or "height" in values:
        check_size(int(values.get("width", 0)), int(values.get("height", 0)), multiple, sizes, field="width")
    if "num_frames" in values:
        check_frames(int(values["num_frames"]), temporal, sizes)
    for name, most in (("num_inference_steps", sizes.max_steps), ("fps", sizes.max_fps)):
        if name in values and not 1 <= values[name] <= most:
            raise InvalidInput(name, f"must be between 1 and {most}, got {values[name]}")
    for name in ("guidance_scale", "guidance_scale_2"):
        if name in values and not math.isfinite(values[name]):
            raise InvalidInput(name, f"must be a finite number, got {values[name]}")
    if values.get("seed", 0) < 0:
        raise InvalidInput("seed", f"must be between 0 and {SEED_MAX}, got {values['seed']}")
    return values
