"""What the image steps check in the tensors they are handed, before any work.

The pre step checks a client's request; every later step can be called directly too, with tensors no
pre step made. These checks turn a malformed tensor into InvalidInput naming it (INVALID_ARG) instead of
a torch error deep in a model, and keep one request from failing the others it would be batched with.
They read shapes, which are on the host, and host arrays only: never a value on the device.
"""
from __future__ import annotations

import math

import numpy as np

from triton_omni.image.request import ServedSizes
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request


def check_size(width: int, height: int, multiple: int, sizes: ServedSizes) -> None:
    """An output size in pixels: positive multiples of `multiple`, within the largest size served."""
    for name, value in (("width", width), ("height", height)):
        if value < multiple or value % multiple or value > sizes.max_side:
            raise InvalidInput(name, f"{value} px; expected a multiple of {multiple} between {multiple} and "
                                     f"{sizes.max_side}")
    if width * height > sizes.max_pixels:
        raise InvalidInput("width", f"{width}x{height} is {width * height} pixels; at most {sizes.max_pixels} are served")


def check_settings(req: Request, multiple: int, sizes: ServedSizes) -> dict:
    """The settings a pre step hands the denoise step, checked again: width, height, steps, guidance, seed, n."""
    values = {name: req.scalar(name) for name in
              ("width", "height", "num_inference_steps", "guidance_scale", "seed", "n")}
    check_size(int(values["width"]), int(values["height"]), multiple, sizes)
    for name, most in (("num_inference_steps", sizes.max_steps), ("n", sizes.max_images)):
        if not 1 <= values[name] <= most:
            raise InvalidInput(name, f"must be between 1 and {most}, got {values[name]}")
    if not math.isfinite(values["guidance_scale"]):
        raise InvalidInput("guidance_scale", f"must be a finite number, got {values['guidance_scale']}")
    return values


def check_ids(ids: np.ndarray, mask: np.ndarray, vocab: int, names=("text_ids", "text_mask")) -> None:
    """Token ids [rows, L] and their mask (host arrays): same shape, at least one token, ids in the vocabulary
    (an id past the embedding table is an index error on the CPU and a device-side assert on a GPU)."""
    if ids.shape != mask.shape:
        raise InvalidInput(names[1], f"shape {list(mask.shape)} differs from {names[0]}'s {list(ids.shape)}")
    if ids.size == 0 or not mask.any():
        raise InvalidInput(names[0], "no tokens")
    if ids.min() < 0 or ids.max() >= vocab:
        raise InvalidInput(names[0], f"ids must be between 0 and {vocab - 1} (the vocabulary), got "
                                     f"{int(ids.min())}..{int(ids.max())}")
    if mask.min() < 0 or mask.max() > 1:
        raise InvalidInput(names[1], "must hold only 0 and 1")


def check_latents(name: str, shape: tuple, channels: int, scale: int, sizes: ServedSizes) -> None:
    """Latents [n, C, h, w] (or an image's [C, h, w]): the model's channels, a size the VAE decodes
    (each latent cell is `scale` pixels a side) and no larger than the largest image served."""
    c, h, w = shape[-3:]
    if c != channels:
        raise InvalidInput(name, f"shape {list(shape)}: this model's latents have {channels} channels")
    if h < 1 or w < 1:
        raise InvalidInput(name, f"shape {list(shape)}: empty")
    if h * scale > sizes.max_side or w * scale > sizes.max_side or h * w * scale * scale > sizes.max_pixels:
        raise InvalidInput(name, f"shape {list(shape)} decodes to {w * scale}x{h * scale} pixels; at most "
                                 f"{sizes.max_side} a side and {sizes.max_pixels} pixels are served")
