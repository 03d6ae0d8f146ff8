"""Video generation (route `video`): an MP4 out, from a prompt and optionally a first frame.

A video model streams its progress while it denoises (responses whose `progress` is (steps done,
steps)), then the MP4 in a last response: `generate` passes each progress report to `on_progress`.
"""
from __future__ import annotations

from typing import Callable

from triton_omni.client.tensors import first
from triton_omni.client.triton import responses


def video_values(prompt: str, negative_prompt: str | None = None, size: str | None = None,
                 num_frames: int | None = None, seconds: float | None = None, fps: int | None = None,
                 num_inference_steps: int | None = None, guidance_scale: float | None = None,
                 guidance_scale_2: float | None = None, seed: int | None = None, image: bytes | None = None) -> dict:
    """The request tensors of the `video` route (ensemble_configs/README.md); None: the model's default."""
    return {"prompt": (prompt, "BYTES"), "negative_prompt": (negative_prompt, "BYTES"), "size": (size, "BYTES"),
            "num_frames": (num_frames, "INT32"), "seconds": (seconds, "FP32"), "fps": (fps, "INT32"),
            "num_inference_steps": (num_inference_steps, "INT32"), "guidance_scale": (guidance_scale, "FP32"),
            "guidance_scale_2": (guidance_scale_2, "FP32"), "seed": (seed, "INT64"), "image": (image, "BYTES")}


class VideoClient:
    def __init__(self, url: str = "localhost:8001", timeout_s: float = 3600.0):
        self.url = url
        self.timeout_s = timeout_s

    def generate(self, model: str, prompt: str, on_progress: Callable[[int, int], None] | None = None,
                 **kwargs) -> bytes:
        """MP4 bytes. kwargs: see `video_values` (image: the encoded first frame)."""
        video = b""
        for outputs in responses(self.url, model, video_values(prompt, **kwargs), self.timeout_s):
            progress = outputs.get("progress")
            if progress is not None and progress.size == 2 and on_progress is not None:
                done, total = (int(v) for v in progress.reshape(-1))
                on_progress(done, total)
            video += first(outputs, "video", b"") or b""
        if not video:
            raise RuntimeError(f"{model}: no video in the response")
        return video
