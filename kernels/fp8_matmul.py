"""Triton kernels for FP8 (E4M3) weights; kernels.fp8_matmul_reference defines what each computes (and
the weight format: float8 values q, float32 scales s per output channel or per block).

    skinny_fp8_linear        x @ (q * s).T (+ bias) for one row (batch-1 decode): decode_matmul's skinny
                             kernel with fp8 weight tiles dequantized in registers; optionally
                             silu(gate) * up of its input on the fly
    skinny_fp8_norm_linear   the same with the input's (residual add +) RMSNorm folded in
    quantize_rows            activations to fp8 with one scale a row (or a group of columns), for
                             torch._scaled_mm; silu(gate) * up optionally fused in
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_omni.kernels.decode_matmul import _skinny_config, _skinny_input_tile
from triton_omni.kernels.fp8_matmul_reference import FP8, FP8_MAX, TINY, scale_blocks
from triton_omni.kernels.triton_helpers import FLOATS, residual_add, silu_mul, use_pdl, wait_for_earlier_kernels


# --------------------------------------------------------------------------------------------------
# Skinny FP8 linear: y = x @ (q * s).T (+ bias) for the single row of a batch-1 decode step
# --------------------------------------------------------------------------------------------------
#
# A batch-1 decode step reads every weight once: with one byte a weight it reads half of what bf16
# does. The loop is decode_matmul's (whole weight rows a program, one reduction at the end, the input's
# prologue shared with it, the first tile loaded before the PDL wait); the tiles are fp8, widened to
# fp32 as they are multiplied. Scales: per output channel, the row sums are scaled once at the end;
# per block (bn x bk), a program's BLOCK_N rows lie in one block row (BLOCK_N divides bn), so the scale
# depends on the column only and multiplies the input tile instead of the weight tile.

@triton.jit
def _skinny_fp8_kernel(
    x_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, res_ptr, nw_ptr, s_ptr, N, K, stride_w, stride_ws, eps,
    SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,        # the scale's block; 0, 0: one scale a row
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    ZERO_CENTERED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    k = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_w
    # weights and their scales come from no earlier kernel: read before the wait
    w = tl.load(w_rows + k[None, :], mask=nmask[:, None] & (k < K)[None, :], other=0.0,
                eviction_policy="evict_first")
    row_scale = 1.0
    ws_row = ws_ptr
    if SCALE_BN == 0:
        row_scale = tl.load(ws_ptr + n, mask=nmask, other=0.0)
    else:
        ws_row = ws_ptr + (pid * BLOCK_N // SCALE_BN) * stride_ws
    wait_for_earlier_kernels(USE_PDL)
    rstd = 1.0
    if NORM:
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + k
            kmask = kk < K
            xs = tl.load(x_ptr + kk, mask=kmask, other=0.0)
            if HAS_RESIDUAL:
                xs = residual_add(xs, tl.load(res_ptr + kk, mask=kmask, other=0.0))
                if pid == 0:
                    tl.store(s_ptr + kk, xs, mask=kmask)
            squares += xs.to(tl.float32) * xs.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    x = _skinny_input_tile(x_ptr, res_ptr, nw_ptr, k, k < K, K, rstd, GATED, NORM, HAS_RESIDUAL,
                           ZERO_CENTERED).to(tl.float32)
    if SCALE_BN > 0:
        x = x * tl.load(ws_row + k // SCALE_BK, mask=k < K, other=0.0)
    partial = w.to(tl.float32) * x[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        kk = k0 + k
        kmask = kk < K
        w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0,
                    eviction_policy="evict_first")
        x = _skinny_input_tile(x_ptr, res_ptr, nw_ptr, kk, kmask, K, rstd, GATED, NORM, HAS_RESIDUAL,
                               ZERO_CENTERED).to(tl.float32)
        if SCALE_BN > 0:
            x = x * tl.load(ws_row + kk // SCALE_BK, mask=kmask, other=0.0)
        partial += w.to(tl.float32) * x[None, :]
    y = tl.sum(partial, axis=1) * row_scale
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=nmask)


def _fp8_config(N: int, K: int, gated: bool, scale_bn: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps): decode_matmul's bf16 tiles with twice the columns where K has
    them (and twice the warps), so that a tile holds as many bytes as the bf16 one. Not yet swept on
    the GPU: `bench_decode_matmul --weights fp8 --sweep` times the neighbours. BLOCK_N divides the
    scale's block height."""
    block_n, block_k, warps = _skinny_config(N, K, gated)
    if 2 * block_k <= max(16, triton.next_power_of_2(K)):
        block_k, warps = 2 * block_k, min(8, 2 * warps)
    while scale_bn and scale_bn % block_n:
        block_n //= 2
    return block_n, block_k, warps


CONFIG_OVERRIDE: dict[tuple[int, int, bool], tuple[int, int, int]] = {}   # (N, K, gated) -> tiles: sweeps


def skinny_fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                      gated: bool = False) -> torch.Tensor:
    """x [1, K] (gated: [1, 2K] = [gate | up]) @ (weight [N, K] fp8 * scale).T (+ bias) -> [1, N] in x's dtype."""
    return _skinny_fp8(x, weight, scale, bias, gated=gated)[0]


def skinny_fp8_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                           zero_centered: bool, weight: torch.Tensor, scale: torch.Tensor,
                           bias: torch.Tensor | None = None):
    """rms_norm(x [+ residual]) [1, K] @ (weight * scale).T (+ bias) -> (y [1, N], x + residual, or x without one)."""
    assert norm_weight.shape == (weight.shape[1],) and norm_weight.dtype == x.dtype, \
        (norm_weight.shape, norm_weight.dtype)
    return _skinny_fp8(x, weight, scale, bias, norm=(residual, norm_weight.contiguous(), eps, zero_centered))


def _skinny_fp8(x, weight, scale, bias, gated=False, norm=None):
    N, K = weight.shape
    assert x.dim() == 2 and x.shape == (1, 2 * K if gated else K), (x.shape, weight.shape, gated)
    assert x.dtype in FLOATS and weight.dtype == FP8 and scale.dtype == torch.float32, \
        (x.dtype, weight.dtype, scale.dtype)
    assert weight.stride(-1) == 1 and scale.is_contiguous(), "weights are laid out at load"
    assert not (gated and norm), "one prologue at a time"
    blocks = scale_blocks(weight.shape, scale.shape)
    scale_bn, scale_bk = blocks or (0, 0)
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty((1, N), dtype=x.dtype, device=x.device)
    residual, norm_weight, eps, zero_centered = norm or (None, x, 0.0, False)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, (residual.shape, residual.dtype)
        residual = residual.contiguous()
        s = torch.empty_like(x)
    else:
        s = x                                            # no add: the residual is the input itself
    block_n, block_k, warps = CONFIG_OVERRIDE.get((N, K, gated)) or _fp8_config(N, K, gated, scale_bn)
    assert not scale_bn or scale_bn % block_n == 0, (scale_bn, block_n)
    pdl = use_pdl(x)
    _skinny_fp8_kernel[(triton.cdiv(N, block_n),)](
        x, weight, scale, bias if bias is not None else x, y,
        residual if residual is not None else x, norm_weight, s, N, K, weight.stride(0),
        scale.stride(0) if blocks else 0, eps,
        SCALE_BN=scale_bn, SCALE_BK=scale_bk, HAS_BIAS=bias is not None, GATED=gated, NORM=norm is not None,
        HAS_RESIDUAL=residual is not None, ZERO_CENTERED=zero_centered, BLOCK_N=block_n, BLOCK_K=block_k,
        USE_PDL=pdl, num_warps=warps, launch_pdl=pdl,
    )
    return y, s


# --------------------------------------------------------------------------------------------------
# Row-wise activation quantization for torch._scaled_mm
# --------------------------------------------------------------------------------------------------

_MAX, _TINY = tl.constexpr(FP8_MAX), tl.constexpr(TINY)
#
# One program a row (or a group of columns of a row): the amax over the span, then each value over
# amax / 448, rounded to E4M3. Gated, the input is [gate | up] and silu(gate) * up (rounded as
# silu_and_mul rounds) is what is quantized: the down projection's activation costs no kernel of its
# own. Both divisions round to nearest, as torch's do, so the fp8 values match the reference's.

@triton.jit
def _span_tile(x_row, kk, mask, K, GATED: tl.constexpr):
    h = tl.load(x_row + kk, mask=mask, other=0.0)
    if GATED:
        h = silu_mul(h, tl.load(x_row + K + kk, mask=mask, other=0.0))
    return h.to(tl.float32)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, SPAN, stride_x, stride_q, stride_s,
                          GATED: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * SPAN
    x_row = x_ptr + row * stride_x
    k = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, SPAN, BLOCK_K):
        kk = start + k0 + k
        mask = (kk < K) & (k0 + k < SPAN)
        amax = tl.maximum(amax, tl.abs(_span_tile(x_row, kk, mask, K, GATED)))
    scale = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), _TINY), _MAX)
    tl.store(s_ptr + row * stride_s + tl.program_id(1), scale)
    for k0 in range(0, SPAN, BLOCK_K):
        kk = start + k0 + k
        mask = (kk < K) & (k0 + k < SPAN)
        q = tl.clamp(tl.math.div_rn(_span_tile(x_row, kk, mask, K, GATED), scale), -_MAX, _MAX)
        tl.store(q_ptr + row * stride_q + kk, q.to(q_ptr.dtype.element_ty), mask=mask)


def quantize_rows(x: torch.Tensor, group: int = 0, gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (gated: [M, 2K]) -> (float8_e4m3fn [M, K], float32 scales [M, 1], or [M, ceil(K / group)])."""
    assert x.dim() == 2 and x.dtype in FLOATS, (x.shape, x.dtype)
    if x.stride(-1) != 1:
        x = x.contiguous()
    M, K = x.shape[0], x.shape[1] // 2 if gated else x.shape[1]
    span = group or K
    groups = triton.cdiv(K, span)
    q = torch.empty((M, K), dtype=FP8, device=x.device)
    s = torch.empty((M, groups), dtype=torch.float32, device=x.device)
    block_k = min(4096, max(16, triton.next_power_of_2(span)))
    if M:
        _quantize_rows_kernel[(M, groups)](x, q, s, K, span, x.stride(0), q.stride(0), s.stride(0),
                                           GATED=gated, BLOCK_K=block_k, num_warps=4 if block_k <= 1024 else 8)
    return q, s
