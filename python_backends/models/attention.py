"""Attention over the engine's paged KV cache.

The cache tensors are owned by the engine and bound to each layer (`k_cache`, `v_cache`:
[num_blocks, block_size, num_kv_heads, head_dim]) before the first forward; the model never
allocates them. Prefill attends within each packed prompt; decode attends one new token per
sequence over its blocks.
"""
from __future__ import annotations

import torch
from torch import nn

from triton_omni.kernels import dispatch
from triton_omni.models.context import AttentionCacheSpec, ForwardContext


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def cache_spec(self) -> AttentionCacheSpec:
        return AttentionCacheSpec(self.num_kv_heads, self.head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                ctx: ForwardContext, rotary, q_norm=None, k_norm=None) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hk, D] as projected -> [T, Hq, D]. q and k are normalised per head
        (when norms are given) and rotated, and k/v written into the cache: one kernel on the GPU."""
        q_w, k_w = (q_norm.weight, k_norm.weight) if q_norm is not None else (None, None)
        eps, zero_centered = (q_norm.eps, q_norm.zero_centered) if q_norm is not None else (0.0, False)
        cos, sin, rows = rotary.tables(positions, ctx)
        q, k = dispatch.qk_norm_rope_store(q, k, v, q_w, k_w, eps, zero_centered, cos, sin, rows,
                                           self.k_cache, self.v_cache, ctx.slot_mapping)
        if ctx.is_prefill and ctx.prefix_lens is not None:      # the prompts' heads are cached: read all from the cache
            return dispatch.prefill_attention_with_prefix(q, self.k_cache, self.v_cache, ctx.block_tables,
                                                          ctx.context_lens, ctx.seq_lens, ctx.prefix_lens, self.scale,
                                                          ctx.cu_seqlens, ctx.max_context_len)
        if ctx.is_prefill:
            return dispatch.prefill_attention(q, k, v, ctx.seq_lens, self.scale, ctx.cu_seqlens, ctx.max_seqlen)
        return dispatch.paged_decode_attention(q, self.k_cache, self.v_cache, ctx.block_tables,
                                               ctx.context_lens, self.scale, ctx.max_context_len)
