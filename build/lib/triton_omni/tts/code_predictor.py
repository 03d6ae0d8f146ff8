"""The per-frame code predictor's attention, shared by the talkers that predict a frame's remaining
codebooks with a small decoder started afresh every frame (Qwen3-TTS's code predictor, Fish S2's fast AR).

The predictor runs a fixed N-token sequence per frame, one token per row per sub-step, so its cache
is dense and owned by the attention layer ([rows, N, Hk, D], rewritten every frame): `PredictorAttention`
declares no `cache_spec`, so the AR engine neither binds nor sizes it, yet it calls the engine's fused
kernels (q/k norm + rope + cache write, paged decode attention) by seeing that cache as a paged one
with one block of N slots per row (`PredictorContext`). `predictor_step` runs one sub-step through a
decoder's layers and final norm.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from triton_omni.kernels import dispatch
from triton_omni.models.decoder import DecoderModel


@dataclass
class PredictorContext:
    """Where the predictor's one token per row sits (sub-step p): its own cache seen as a paged cache
    with one block of N slots per row, so the engine's fused kernels serve it."""
    slot_mapping: torch.Tensor      # [B] row * N + p
    block_tables: torch.Tensor      # [B, 1] int32: row
    context_lens: torch.Tensor      # [B] int32: p + 1
    max_context_len: int            # p + 1 (host)


class PredictorAttention(nn.Module):
    """Attention for the code predictor: one query per row against that row's positions 0..p of a
    dense cache [rows, N, Hk, D] it owns (every frame rewrites positions 0..N-1 before reading them,
    so nothing needs clearing). Same call as PagedAttention (q/k norm, rope and the cache write fused,
    then paged decode attention), but no `cache_spec`: the engine does not bind or size it."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.k_buf: torch.Tensor | None = None
        self.v_buf: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                ctx: PredictorContext, rotary, q_norm=None, k_norm=None) -> torch.Tensor:
        """q: [B, Hq, D], k/v: [B, Hk, D] as projected -> [B, Hq, D]."""
        q_w, k_w = (q_norm.weight, k_norm.weight) if q_norm is not None else (None, None)
        eps, zc = (q_norm.eps, q_norm.zero_centered) if q_norm is not None else (0.0, False)
        q, _ = dispatch.qk_norm_rope_store(q, k, v, q_w, k_w, eps, zc, rotary.cos, rotary.sin, positions,
                                           self.k_buf, self.v_buf, ctx.slot_mapping)
        return dispatch.paged_decode_attention(q, self.k_buf, self.v_buf, ctx.block_tables, ctx.context_lens,
                                               self.scale, ctx.max_context_len)


def predictor_step(model: DecoderModel, x: torch.Tensor, position: int, num_slots: int) -> torch.Tensor:
    """One token per row [B, H] at `position` through `model`'s layers (PredictorAttention: row r's
    cache is slots r * num_slots ...) and final norm."""
    b, dev = x.shape[0], x.device
    rows = torch.arange(b, device=dev)
    ctx = PredictorContext(rows * num_slots + position, rows.int()[:, None],
                           torch.full((b,), position + 1, dtype=torch.int32, device=dev), position + 1)
    positions = torch.full((b,), position, dtype=torch.int64, device=dev)
    residual = None
    for layer in model.layers:
        x, residual = layer(x, residual, positions, ctx)
    x, _ = model.norm(x, residual)
    return x
