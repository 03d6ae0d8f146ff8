"""Still images with Pillow: encode RGB pixels (PNG by default, JPEG, WebP) and decode uploads.

Decoding is where untrusted bytes come in, so it checks before it allocates: the header's size
against a pixel budget (Pillow's own bomb check raises only past twice its default), then a full
load so truncated or corrupt files fail here with a clear message rather than later.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

FORMATS = ("png", "jpeg", "webp")
MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


class ImageDecodeError(ValueError):
    """The bytes are not an image this server can read (the message says why)."""


def encode_image(pixels: np.ndarray, fmt: str = "png", quality: int = 95, png_compress_level: int = 6) -> bytes:
    """[H, W, 3] uint8 RGB -> encoded bytes. PNG is lossless; JPEG and WebP use `quality` (1-100)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected [H, W, 3] uint8 pixels, got {pixels.dtype} {list(pixels.shape)}")
    buf = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(pixels), mode="RGB")
    if fmt == "png":
        image.save(buf, format="PNG", compress_level=png_compress_level)
    elif fmt == "jpeg":
        image.save(buf, format="JPEG", quality=quality)
    else:
        image.save(buf, format="WEBP", quality=quality)
    return buf.getvalue()


def decode_image(data: bytes, max_pixels: int = 64 * 1024 * 1024) -> Image.Image:
    """Encoded bytes (PNG, JPEG, WebP, ... anything Pillow reads) -> an RGB PIL image."""
    if not data:
        raise ImageDecodeError("empty image data")
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ImageDecodeError(f"not a recognised image ({len(data)} bytes; expected PNG, JPEG or WebP)") from None
    except Exception as e:  # noqa: BLE001 - any parser failure is the client's bytes
        raise ImageDecodeError(f"unreadable image header: {e}") from None
    w, h = image.size
    if w <= 0 or h <= 0 or w * h > max_pixels:
        raise ImageDecodeError(f"image is {w}x{h}; at most {max_pixels} pixels are accepted")
    try:
        image.load()
    except Exception as e:  # noqa: BLE001 - truncated or corrupt data
        raise ImageDecodeError(f"corrupt or truncated {image.format or 'image'} data: {e}") from None
    if image.mode != "RGB":
        # Transparent pixels composite onto white, which is what a viewer would show.
        if image.mode in ("RGBA", "LA", "P") and ("A" in image.mode or "transparency" in image.info):
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, rgba)
        image = image.convert("RGB")
    return image


def decode_pixels(data: bytes, max_pixels: int = 64 * 1024 * 1024) -> np.ndarray:
    """Encoded bytes -> [H, W, 3] uint8 RGB."""
    return np.asarray(decode_image(data, max_pixels))
