"""Torch references of kernels.decode_matmul: the definition of what each kernel must compute."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from triton_omni.kernels.norms_reference import rms_norm, silu_and_mul


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           gated: bool = False) -> torch.Tensor:
    """x @ weight.T (+ bias); `gated`: x is a fused [gate | up] projection, silu(gate) * up first."""
    return F.linear(silu_and_mul(x) if gated else x, weight, bias)


def norm_linear(x, residual, norm_weight, eps, zero_centered, weight, bias=None):
    """linear(rms_norm(x [+ residual])) and the new residual (x + residual; x itself without one)."""
    if residual is None:
        return F.linear(rms_norm(x, norm_weight, eps, None, zero_centered), weight, bias), x
    h, residual = rms_norm(x, norm_weight, eps, residual, zero_centered)
    return F.linear(h, weight, bias), residual
