"""Torch references of kernels.attention: the definition of what each kernel must compute; and the
prefill's causal attention over packed prompts (kernels.dispatch.prefill_attention takes torch's fused
kernels on CUDA)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from triton_omni.kernels.norms_reference import rms_norm


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor):
    """Rotate-half RoPE on the first 2*cos.shape[-1] dims of each head. q: [T, Hq, D], k: [T, Hk, D]."""
    c = cos[positions].unsqueeze(1)   # [T, 1, rd/2]
    s = sin[positions].unsqueeze(1)
    half = cos.shape[-1]

    def rot(x):
        x1, x2, rest = x[..., :half].float(), x[..., half:2 * half].float(), x[..., 2 * half:]
        out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
        return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out

    return rot(q), rot(k)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write k, v [T, H, D] into the paged caches [num_blocks, block_size, H, D]; slot -1 is skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]


def qk_norm_rope_store(q, k, v, q_weight, k_weight, eps, zero_centered, cos, sin, positions,
                       k_cache, v_cache, slot_mapping):
    """Per-head RMSNorm of q and k (when weights are given), rotary on both, then k (rotated) and v
    written into the paged caches. Returns the new (q, k)."""
    if q_weight is not None:
        q = rms_norm(q, q_weight, eps, None, zero_centered)
        k = rms_norm(k, k_weight, eps, None, zero_centered)
    q, k = rotary(q, k, cos, sin, positions)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q, k

def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           max_context_len: int) -> torch.Tensor:
    """One query token per sequence against its paged context. q: [B, Hq, D] -> [B, Hq, D]."""
    B, Hq, D = q.shape
    block_size, Hk = k_cache.shape[1], k_cache.shape[2]
    pos = torch.arange(max_context_len, device=q.device)
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size   # [B, L]
    k = k_cache.view(-1, Hk, D)[slots].float()                                          # [B, L, Hk, D]
    v = v_cache.view(-1, Hk, D)[slots].float()
    qg = q.float().view(B, Hk, Hq // Hk, D)
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale
    valid = pos[None, :] < context_lens[:, None]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bhgl,blhd->bhgd", scores.softmax(-1), v)
    return out.reshape(B, Hq, D).to(q.dtype)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int],
                      scale: float) -> torch.Tensor:
    """Causal attention within each of the packed sequences (some may be empty). q: [T, Hq, D], k/v: [T, Hk, D]."""
    out, start = [], 0
    for n in filter(None, seq_lens):
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                                  enable_gqa=True).transpose(0, 1))
        start += n
    return torch.cat(out, dim=0)


def prefill_attention_with_prefix(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor, seq_lens: list[int],
                                  prefix_lens: list[int], scale: float) -> torch.Tensor:
    """Causal attention of packed prompt tails over their whole prompts in the paged cache (prefix
    caching: each prompt's first prefix_lens[i] tokens were cached, its next seq_lens[i] are the packed
    queries q [T, Hq, D], at positions prefix_lens[i] on, and all of its K/V, new ones included, are
    already in k_cache / v_cache [num_blocks, block_size, Hk, D] through block_tables [B, max_blocks])."""
    block_size, Hk, D = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    out, start = [], 0
    for i, (n, c) in enumerate(zip(seq_lens, prefix_lens)):
        if n == 0:
            continue
        pos = torch.arange(c + n, device=q.device)
        slots = block_tables[i, pos // block_size].long() * block_size + pos % block_size
        k, v = k_cache.view(-1, Hk, D)[slots], v_cache.view(-1, Hk, D)[slots]
        visible = pos[None, :] <= (c + torch.arange(n, device=q.device))[:, None]          # [n, c + n]
        qs = q[start:start + n]
        out.append(F.scaled_dot_product_attention(qs.transpose(0, 1), k.transpose(0, 1).to(q.dtype),
                                                  v.transpose(0, 1).to(q.dtype), attn_mask=visible, scale=scale,
                                                  enable_gqa=True).transpose(0, 1))
        start += n
    return torch.cat(out, dim=0)
