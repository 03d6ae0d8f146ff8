"""Building blocks shared by the decoder models: norms, rotary embedding, gated MLP, fused linears.

Each has a plain torch form (the reference, used on CPU); on CUDA the engine can route the hot ones
to the Triton kernels in `kernels/` (same maths, checked against these forms).
"""
from __future__ import annotations

import torch
from torch import nn

from triton_omni.kernels import dispatch


class RMSNorm(nn.Module):
    """RMSNorm as transformers computes it: in fp32, then scaled by `weight` (or `1 + weight`
    for the zero-centred variant that Qwen3.5 uses)."""

    def __init__(self, dim: int, eps: float = 1e-6, zero_centered: bool = False):
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """With `residual`: returns (norm(x + residual), x + residual), fused on the GPU."""
        return dispatch.rms_norm(x, self.weight, self.eps, residual, self.zero_centered)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for all positions up to max_positions; rotate-half convention.
    `rotary_dim` < head_dim rotates only the first dims (partial rotary)."""

    def __init__(self, inv_freq: torch.Tensor, max_positions: int, scaling: float = 1.0):
        super().__init__()
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq.float())
        self.rotary_dim = inv_freq.numel() * 2
        # [max_positions, rotary_dim/2] each; kept in fp32 and cast when applied
        self.register_buffer("cos", freqs.cos() * scaling, persistent=False)
        self.register_buffer("sin", freqs.sin() * scaling, persistent=False)


def rope_inv_freq(config, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling for any rope type transformers knows."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * partial)
    if rope_type == "default":
        base = params["rope_theta"]
        inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
        return inv, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS[rope_type](config, device=None)


class Linear(nn.Linear):
    """nn.Linear through `dispatch.linear` (decode-sized inputs take the skinny kernel on the GPU).
    `gated`: the input is a fused [gate | up] projection, multiplied as silu(gate) * up first."""

    def forward(self, x: torch.Tensor, gated: bool = False) -> torch.Tensor:
        return dispatch.linear(x, self.weight, self.bias, gated)


class MergedLinear(nn.Module):
    """Several bias-free projections of the same input fused into one matmul (e.g. q/k/v, gate/up).
    Checkpoints keep them apart; `load_part` copies each into its slice."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False):
        super().__init__()
        self.out_sizes = list(out_sizes)
        self.weight = nn.Parameter(torch.empty(sum(out_sizes), in_features))
        self.bias = nn.Parameter(torch.zeros(sum(out_sizes))) if bias else None

    def load_part(self, index: int, tensor: torch.Tensor, which: str = "weight") -> None:
        start = sum(self.out_sizes[:index])
        getattr(self, which).data[start:start + self.out_sizes[index]].copy_(tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch.linear(x, self.weight, self.bias)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden, [intermediate, intermediate], bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), gated=True)
