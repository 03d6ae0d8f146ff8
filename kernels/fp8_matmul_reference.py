"""Torch references of kernels.fp8_matmul, and the FP8 (E4M3) weight format they share.

A weight [N, K] is stored as float8_e4m3fn values q and float32 dequantization scales s, weight = q * s:
- per output channel: s [N], each row's amax / 448 (E4M3's largest finite value);
- per block (bn x bk, powers of two; the released FP8 checkpoints' `weight_scale_inv`, 128 x 128):
  s [ceil(N / bn), ceil(K / bk)], each block's amax / 448. The block is read off the two shapes
  (`scale_blocks`): the smallest power of two that covers N / rows of s (and K / columns).

Two matmuls use it:
    fp8_linear        weight-only: x (16/32-bit) @ (q * s).T in fp32, rounded to x's dtype once; what the
                      batch-1 skinny kernel computes (weights dequantized in registers)
    w8a8_linear       x quantized too, one scale a row (a 1 x bk group of a row for block weights), then
                      the fp32 product of the two dequantized operands: what torch._scaled_mm computes
and `quantize_rows` is that activation quantizer (the kernel fuses silu(gate) * up into it).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from triton_omni.kernels.norms_reference import rms_norm, silu_and_mul

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
TINY = 1e-12                 # amax floor: an all-zero row or block gets a finite scale (and zeros)


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def scale_blocks(weight_shape, scale_shape) -> tuple[int, int] | None:
    """(bn, bk) of a per-block scale of `weight_shape` [N, K]; None for a per-channel one [N]."""
    N, K = weight_shape
    if len(scale_shape) == 1:
        if scale_shape[0] != N:
            raise ValueError(f"per-channel scale {tuple(scale_shape)} for a weight of {N} rows")
        return None
    rows, cols = scale_shape
    bn, bk = _pow2_at_least(-(-N // rows)), _pow2_at_least(-(-K // cols))
    if -(-N // bn) != rows or -(-K // bk) != cols:
        raise ValueError(f"scale {tuple(scale_shape)} is no power-of-two block grid of a weight {N} x {K}")
    return bn, bk


def _block_amax(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    N, K = w.shape
    rows, cols = -(-N // bn), -(-K // bk)
    padded = F.pad(w.abs(), (0, cols * bk - K, 0, rows * bn - N))
    return padded.view(rows, bn, cols, bk).amax(dim=(1, 3))


def expand_scale(scale: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """The scale of every weight element: [N, 1] (per channel) or [N, K] (per block)."""
    blocks = scale_blocks((N, K), scale.shape)
    if blocks is None:
        return scale.float()[:, None]
    bn, bk = blocks
    return scale.float().repeat_interleave(bn, 0)[:N].repeat_interleave(bk, 1)[:, :K]


def quantize_weight(w: torch.Tensor, block: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q float8_e4m3fn [N, K], s float32): per output channel, or per `block` (bn, bk)."""
    w = w.detach().float()
    N, K = w.shape
    if block is None:
        scale = w.abs().amax(dim=1).clamp(min=TINY) / FP8_MAX
    else:
        scale = _block_amax(w, *block).clamp(min=TINY) / FP8_MAX
        scale_blocks((N, K), scale.shape)                # the block must be one the shapes can tell
    q = (w / expand_scale(scale, N, K)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * s in float32 [N, K]."""
    return q.float() * expand_scale(scale, *q.shape)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
               gated: bool = False) -> torch.Tensor:
    """x [M, K] (gated: [M, 2K] = [gate | up], silu(gate) * up first, in x's dtype) @ (q * s).T (+ bias),
    computed in fp32 and rounded to x's dtype."""
    h = silu_and_mul(x) if gated else x
    y = F.linear(h.float(), dequantize_weight(weight, scale), None if bias is None else bias.float())
    return y.to(x.dtype)


def fp8_norm_linear(x, residual, norm_weight, eps, zero_centered, weight, scale, bias=None):
    """fp8_linear(rms_norm(x [+ residual])) and the new residual (x + residual; x itself without one)."""
    if residual is None:
        return fp8_linear(rms_norm(x, norm_weight, eps, None, zero_centered), weight, scale, bias), x
    h, residual = rms_norm(x, norm_weight, eps, residual, zero_centered)
    return fp8_linear(h, weight, scale, bias), residual


def quantize_rows(x: torch.Tensor, group: int = 0, gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (gated: [M, 2K], silu(gate) * up first) as float8_e4m3fn [M, K] and float32 scales
    [M, 1] (group 0: one a row) or [M, ceil(K / group)] (one per `group` columns of a row)."""
    h = (silu_and_mul(x) if gated else x).float()
    M, K = h.shape
    if group == 0:
        scale = h.abs().amax(dim=1, keepdim=True).clamp(min=TINY) / FP8_MAX
        return (h / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
    scale = _block_amax(h, 1, group).clamp(min=TINY) / FP8_MAX
    full = scale.repeat_interleave(group, 1)[:, :K]
    return (h / full).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def w8a8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                gated: bool = False) -> torch.Tensor:
    """fp8_linear with x quantized as well: rows (per-channel weights) or 1 x bk groups of rows (block
    weights), both operands dequantized, multiplied in fp32, rounded to x's dtype."""
    N, K = weight.shape
    blocks = scale_blocks((N, K), scale.shape)
    xq, sx = quantize_rows(x, 0 if blocks is None else blocks[1], gated)
    a = xq.float() * (sx if blocks is None else sx.repeat_interleave(blocks[1], 1)[:, :K])
    y = F.linear(a, dequantize_weight(weight, scale), None if bias is None else bias.float())
    return y.to(x.dtype)
