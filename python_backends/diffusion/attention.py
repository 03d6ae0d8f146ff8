"""The attention kernel of a diffusers transformer, a step parameter (`attention`) of the denoise steps."""
from __future__ import annotations

import torch

# `attention` -> diffusers' attention backend. native: torch's SDPA picks (FLASH on an H200 when no
# mask is given); cudnn: cuDNN's fused attention, CUDA only. Same maths, other rounding. On an H200 at
# the image DiT shapes (bf16, 24-30 heads of 128, 1184-4608 tokens) cuDNN took 0.51-0.60x flash's time
# (results/image.md says where it was measured).
ATTENTION_BACKENDS = {"native": "native", "cudnn": "_native_cudnn"}


def set_attention(transformer, name: str, device: str) -> None:
    """Point every attention of `transformer` at the backend `name` (a ValueError names the parameter)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"parameter attention: expected one of {sorted(ATTENTION_BACKENDS)}, got {name!r}")
    if name == "native":
        return
    if torch.device(device).type != "cuda":
        raise ValueError(f"parameter attention: {name!r} needs a CUDA device, this step runs on {device}")
    if not hasattr(transformer, "set_attention_backend"):
        raise ValueError(f"parameter attention: {type(transformer).__name__} takes only 'native'")
    transformer.set_attention_backend(ATTENTION_BACKENDS[name])
