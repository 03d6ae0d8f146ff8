"""The last step of an image model (CPU): pixels -> PNG (default), JPEG or WebP bytes, one per image."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from triton_omni.image import warmup as image_warmup
from triton_omni.image.request import ServedSizes
from triton_omni.media.image import FORMATS, encode_image
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, register


@dataclass
class ImageEncodeParams(ServedSizes):
    quality: int = 95                 # JPEG and WebP
    png_compress_level: int = 6       # 0 (fastest) - 9 (smallest); PNG stays lossless either way


@register("image_encode")
class ImageEncode(Step):
    inputs = (
        TensorSpec("pixels", "TYPE_UINT8", (-1, -1, -1, 3), ragged=True),
        TensorSpec("output_format", "TYPE_STRING", (1,), optional=True),
    )
    outputs = (TensorSpec("images", "TYPE_STRING", (-1,)),)
    Params = ImageEncodeParams

    def input_limits(self) -> dict:
        return {"pixels": (self.params.max_images, self.params.max_side, self.params.max_side, None)}

    def warmup_inputs(self, spec) -> list[dict]:
        return image_warmup.encode_samples(spec, FORMATS)

    def one(self, req: Request) -> dict:
        fmt = (req.string("output_format", "") or "png").lower()
        if fmt not in FORMATS:
            raise InvalidInput("output_format", f"expected one of {', '.join(FORMATS)}; got {fmt!r}")
        pixels = req.get("pixels")
        n, h, w, _ = pixels.shape
        if n < 1 or h < 1 or w < 1 or h * w > self.params.max_pixels:
            raise InvalidInput("pixels", f"shape {list(pixels.shape)}: expected 1 or more images of 1 to "
                                         f"{self.params.max_pixels} pixels")
        if hasattr(pixels, "cpu"):          # a torch tensor from a GPU step
            pixels = pixels.cpu().numpy()
        encoded = [encode_image(p, fmt, self.params.quality, self.params.png_compress_level) for p in pixels]
        return {"images": np.array(encoded, dtype=np.object_)}

