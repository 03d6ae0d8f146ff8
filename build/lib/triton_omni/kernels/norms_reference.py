"""Torch references of kernels.norms: the definition of what each kernel must compute."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             zero_centered: bool = False):
    """norm(x [+ residual]) in fp32; returns (y, new_residual) when a residual is given."""
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        y = (h * (1.0 + weight.float())).to(x.dtype)
    else:
        y = weight * h.to(x.dtype)
    return y if residual is None else (y, residual)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
