"""Prometheus metrics of a diffusion denoise step (runtime/metrics.py): the time of each denoising
step of a batched run, and images (or videos) a second, for every model whose denoise step builds on
image/denoise.py."""
from __future__ import annotations

import time

import torch

from triton_omni.runtime.metrics import RATE_BUCKETS, Counter, Histogram


class DenoiseMetrics:
    def __init__(self, model: str, device: str):
        self.device = torch.device(device)
        self.step_time = Histogram("triton_omni_diffusion_step_seconds",
                                   "seconds per denoising step of a batched run (all its images and guidance rows)",
                                   model)
        self.rate = Histogram("triton_omni_diffusion_images_per_second",
                              "images (videos) a second of each batched denoise run", model, RATE_BUCKETS)
        self.images = Counter("triton_omni_diffusion_images_total", "images (videos) denoised", model)
        self.requests = Counter("triton_omni_diffusion_requests_total", "requests denoised", model)

    def start(self) -> float:
        return time.perf_counter()

    def done(self, start: float, steps: int, images: int, requests: int) -> None:
        """A run of `steps` denoising steps over `images` images of `requests` requests, begun at `start`."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)      # the run's kernels, not only their launches
        seconds = max(time.perf_counter() - start, 1e-9)
        self.step_time.observe(seconds / max(steps, 1))
        self.rate.observe(images / seconds)
        self.images.inc(images)
        self.requests.inc(requests)
