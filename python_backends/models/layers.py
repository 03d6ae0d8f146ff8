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

    axes = 1        # rotary position axes a token has (MRotaryEmbedding: 3)

    def tables(self, positions: torch.Tensor, ctx) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(cos, sin, row of each token in them) for this forward: the position tables at the tokens'
        rotary positions (ctx.rope_positions where the engine sets them [T], else `positions`)."""
        rope = ctx.rope_positions
        if rope is None:
            return self.cos, self.sin, positions
        if rope.dim() == 2 and rope.shape[0] == 1:      # one axis's row (a spliced prompt's packed positions)
            rope = rope[0]
        if rope.dim() != 1:
            raise ValueError(f"{type(self).__name__} takes one rotary axis, got positions {list(rope.shape)}")
        return self.cos, self.sin, rope


class MRotaryEmbedding(RotaryEmbedding):
    """Multimodal rope (Qwen-VL, Qwen3.5, Qwen3-Omni): a token has a (time, height, width) position and
    each rotary frequency takes one axis's. `sections` [s_t, s_h, s_w] (summing to rotary_dim/2) say
    how many frequencies each axis gets: contiguous blocks, or `interleaved` (Qwen3.5: frequency i takes
    height if i % 3 == 1 and i < 3 s_h, width if i % 3 == 2 and i < 3 s_w, else time).

    Text tokens have the same position on every axis, so without ctx.rope_positions, or with one
    row of them (a decode step after an image), this is the 1-D rotary exactly. With [3, T] rows
    (a prefill of a prompt with images) it gathers each token's own cos/sin row once per forward and
    hands the kernels that per-token table with rows 0..T-1: the kernels stay 1-D."""

    axes = 3

    def __init__(self, inv_freq: torch.Tensor, max_positions: int, scaling: float, sections: list[int],
                 interleaved: bool):
        super().__init__(inv_freq, max_positions, scaling)
        half = inv_freq.numel()
        if sum(sections) != half or len(sections) != 3:
            raise ValueError(f"mrope sections {sections} must be 3 numbers summing to {half} (rotary_dim / 2)")
        axis = torch.zeros(half, dtype=torch.int64)
        if interleaved:
            for a in (1, 2):
                axis[a:3 * sections[a]:3] = a
        else:
            axis[sections[0]:sections[0] + sections[1]] = 1
            axis[sections[0] + sections[1]:] = 2
        self.register_buffer("axis_of_freq", axis, persistent=False)

    def tables(self, positions, ctx):
        rope = ctx.rope_positions
        if rope is None or rope.dim() == 1:
            return super().tables(positions, ctx)
        cached = ctx.memo.get("mrope_tables")
        if cached is None:              # the same for every attention layer of this forward
            per_freq = rope[self.axis_of_freq]                          # [rd/2, T]: each frequency's position
            freq = torch.arange(per_freq.shape[0], device=rope.device)[:, None]
            cached = ctx.memo["mrope_tables"] = (self.cos[per_freq, freq].T.contiguous(),
                                                 self.sin[per_freq, freq].T.contiguous(),
                                                 torch.arange(rope.shape[1], device=rope.device))
        return cached


def rotary_embedding(config, head_dim: int) -> RotaryEmbedding:
    """The rotary a config asks for: multimodal (`mrope_section` in its rope parameters) or 1-D."""
    inv_freq, scaling = rope_inv_freq(config, head_dim)
    params = getattr(config, "rope_parameters", None) or {}
    sections = params.get("mrope_section")
    if sections:
        return MRotaryEmbedding(inv_freq, config.max_position_embeddings, scaling, list(sections),
                                bool(params.get("mrope_interleaved", False)))
    return RotaryEmbedding(inv_freq, config.max_position_embeddings, scaling)


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
