"""Images (routes `image_generation` and `image_edit`): encoded images out (png, jpeg, webp)."""
from __future__ import annotations

from triton_omni.client.tensors import items
from triton_omni.client.triton import responses


def image_values(prompt: str, negative_prompt: str | None = None, size: str | None = None,
                 num_inference_steps: int | None = None, guidance_scale: float | None = None,
                 seed: int | None = None, n: int | None = None, output_format: str | None = None) -> dict:
    """The request tensors shared by image generation, image edit and video (where they apply)."""
    return {"prompt": (prompt, "BYTES"), "negative_prompt": (negative_prompt, "BYTES"), "size": (size, "BYTES"),
            "num_inference_steps": (num_inference_steps, "INT32"), "guidance_scale": (guidance_scale, "FP32"),
            "seed": (seed, "INT64"), "n": (n, "INT32"), "output_format": (output_format, "BYTES")}


class ImageClient:
    def __init__(self, url: str = "localhost:8001", timeout_s: float = 900.0):
        self.url = url
        self.timeout_s = timeout_s

    def generate(self, model: str, prompt: str, **kwargs) -> list[bytes]:
        """`n` encoded images (kwargs: see `image_values`)."""
        return self._images(model, image_values(prompt, **kwargs))

    def edit(self, model: str, images: list[bytes], prompt: str, **kwargs) -> list[bytes]:
        """Edit one or more encoded input images following the prompt."""
        if not images:
            raise ValueError("edit needs at least one input image")
        return self._images(model, {**image_values(prompt, **kwargs), "image": (list(images), "BYTES")})

    def _images(self, model: str, values: dict) -> list[bytes]:
        out: list[bytes] = []
        for outputs in responses(self.url, model, values, self.timeout_s):
            out += items(outputs, "images")
        return out
