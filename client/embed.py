"""Embeddings (route `embeddings`): a text embedder's `text`, or a video encoder's `video` (encoded bytes).

    client = EmbedClient("localhost:8001")
    vector = client.text("qwen3_embed", "Triton serves models")            # [D] float32
    pooled, patches = client.video("vjepa2_embed", open("clip.mp4", "rb").read(), num_frames=16)
"""
from __future__ import annotations

import numpy as np

from triton_omni.client.triton import responses


class EmbedClient:
    def __init__(self, url: str = "localhost:8001", timeout_s: float = 300.0):
        self.url = url
        self.timeout_s = timeout_s

    def _outputs(self, model: str, values: dict) -> dict:
        last = {}
        for outputs in responses(self.url, model, values, self.timeout_s):
            last = outputs
        return last

    def text(self, model: str, text: str) -> np.ndarray:
        return np.asarray(self._outputs(model, {"text": (text, "BYTES")})["embedding"], dtype=np.float32)

    def video(self, model: str, video: bytes, num_frames: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The clip's embedding [D] and one per patch [N, D]."""
        out = self._outputs(model, {"video": (video, "BYTES"), "num_frames": (num_frames, "INT32")})
        return np.asarray(out["embedding"], np.float32), np.asarray(out["patch_embeddings"], np.float32)
