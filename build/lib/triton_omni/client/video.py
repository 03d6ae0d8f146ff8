"""Video generation (route `video`): an MP4 out, optionally from a first frame."""
from __future__ import annotations

from triton_omni.client.image import image_values
from triton_omni.client.tensors import first
from triton_omni.client.triton import responses


class VideoClient:
    def __init__(self, url: str = "localhost:8001", timeout_s: float = 3600.0):
        self.url = url
        self.timeout_s = timeout_s

    def generate(self, model: str, prompt: str, seconds: float | None = None, image: bytes | None = None,
                 **kwargs) -> bytes:
        """MP4 bytes. kwargs: negative_prompt, size, num_inference_steps, guidance_scale, seed."""
        values = {**image_values(prompt, **kwargs), "seconds": (seconds, "FP32"), "image": (image, "BYTES")}
        video = b""
        for outputs in responses(self.url, model, values, self.timeout_s):
            video += first(outputs, "video", b"")
        if not video:
            raise RuntimeError(f"{model}: no video in the response")
        return video
