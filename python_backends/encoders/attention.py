"""Bidirectional attention within each sequence of a packed batch (no padding to the longest).

An audio encoder sees every request's segments as one [T, H, D] tensor and `cu_seqlens` (the start of
each sequence, [N + 1]). On CUDA in 16-bit that is one call of the varlen flash kernel; otherwise
(CPU, float32) a fused SDPA call per sequence, the same maths one clip at a time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from triton_omni.kernels.dispatch import varlen_attention_supported


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     seq_lens: list[int], max_seqlen: int, scale: float) -> torch.Tensor:
    """q, k, v [T, H, D] -> [T, H, D]; sequence i holds rows cu_seqlens[i]:cu_seqlens[i + 1] (device,
    int32), of length seq_lens[i] (host)."""
    if q.is_cuda and varlen_attention_supported(q.dtype, q.shape[-1], q.device):
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                       0.0, False, False, scale=scale)[0]
    out, start = [], 0
    for n in seq_lens:
        qs, ks, vs = (t[start:start + n].transpose(0, 1)[None] for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, scale=scale)[0].transpose(0, 1))
        start += n
    return torch.cat(out, dim=0)
