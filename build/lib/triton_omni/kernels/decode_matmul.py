"""Triton kernels for the batch-1 decode matmuls; kernels.decode_matmul_reference defines what each computes.

    skinny_linear            x @ w.T (+ bias) for one row (batch-1 decode): weight-streaming, no split-K
                             reduction pass; optionally silu(gate) * up of its input on the fly
    skinny_norm_linear       the same with the input's (residual add +) RMSNorm folded in
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_omni.kernels.triton_helpers import (FLOATS, norm_scale, residual_add, silu_mul, use_pdl,
                                                  wait_for_earlier_kernels)


# --------------------------------------------------------------------------------------------------
# Skinny linear: y = x @ w.T (+ bias) for the single row of a batch-1 decode step
# --------------------------------------------------------------------------------------------------
#
# At batch 1 a decode step's matmuls are weight reads: cuBLAS picks split-K kernels plus a reduction
# launch for them (Qwen3-0.6B's o_proj, 4 MB of weights: 12.6 us on an H200, against 3.4 here;
# results/decode_matmul.md has every shape). Here each program streams
# BLOCK_N whole weight rows (no split, no second pass), accumulates elementwise in fp32 and reduces
# once at the end. GATED: the input is the fused gate/up projection [gate | up] and silu(gate) * up
# is formed while loading (rounded as silu_and_mul rounds), which saves that kernel's launch. NORM:
# the input is a hidden state before its RMSNorm (fused with the residual add when HAS_RESIDUAL), as
# rms_norm computes it: every program sums the squares over the row first (a few KB from the L2),
# then normalises each tile as it loads it; program 0 also writes x + residual, the new residual.
# That saves the norm's launch before the q/k/v and gate/up projections.
# Only one row: with more, cuBLAS's tensor-core kernels are as fast or faster (measured to 8 rows).
# Tried and slower (H200, Qwen3-0.6B c=1, same run each): asking the L2 for the weights the next
# matmuls read, with Hopper's bulk prefetch (cp.async.bulk.prefetch.L2), from a kernel of its own
# after each q/k/v projection (0.776 -> 0.847 ms a token: one more kernel in the chain of waits), or
# from each skinny matmul's programs before their wait, for the next matmul (0.777 -> 0.974 ms).

@triton.jit
def _skinny_input_tile(x_ptr, res_ptr, nw_ptr, kk, kmask, K, rstd,
                       GATED: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       ZERO_CENTERED: tl.constexpr):
    x = tl.load(x_ptr + kk, mask=kmask, other=0.0)
    if GATED:
        x = silu_mul(x, tl.load(x_ptr + K + kk, mask=kmask, other=0.0))
    if NORM:
        if HAS_RESIDUAL:
            x = residual_add(x, tl.load(res_ptr + kk, mask=kmask, other=0.0))
        nw = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        x = norm_scale(x.to(tl.float32) * rstd, nw, x.dtype, ZERO_CENTERED).to(x.dtype)
    return x


@triton.jit
def _skinny_linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, res_ptr, nw_ptr, s_ptr, N, K, stride_w, eps,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    ZERO_CENTERED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    k = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_w
    # each weight is read once: evict it first, keep the L2 for the input row. The first tile is
    # loaded before the wait (weights never come from an earlier kernel), the rest in the loop.
    w = tl.load(w_rows + k[None, :], mask=nmask[:, None] & (k < K)[None, :], other=0.0,
                eviction_policy="evict_first")
    wait_for_earlier_kernels(USE_PDL)
    rstd = 1.0
    if NORM:
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + k
            kmask = kk < K
            x = tl.load(x_ptr + kk, mask=kmask, other=0.0)
            if HAS_RESIDUAL:
                x = residual_add(x, tl.load(res_ptr + kk, mask=kmask, other=0.0))
                if pid == 0:
                    tl.store(s_ptr + kk, x, mask=kmask)
            squares += x.to(tl.float32) * x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    x = _skinny_input_tile(x_ptr, res_ptr, nw_ptr, k, k < K, K, rstd, GATED, NORM, HAS_RESIDUAL, ZERO_CENTERED)
    partial = w.to(tl.float32) * x.to(tl.float32)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        kk = k0 + k
        kmask = kk < K
        w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0,
                    eviction_policy="evict_first")
        x = _skinny_input_tile(x_ptr, res_ptr, nw_ptr, kk, kmask, K, rstd, GATED, NORM, HAS_RESIDUAL, ZERO_CENTERED)
        partial += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(partial, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=nmask)


def _skinny_config(N: int, K: int, gated: bool = False) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps), from sweeps on an H200 over the Qwen3 0.6B and 8B decode
    shapes (weights past the L2): enough programs to keep every SM streaming, 8-16 KB of weights a
    tile. From K = 2048 on, 4 rows of 2048 (with evict_first loads: 8B o_proj 10.9 -> 10.2 us,
    gate/up 48.3 -> 47.3, q/k/v 14.3 -> 14.0). Gated, each program forms silu(gate) * up over all
    of K again: past 512 programs, twice the rows a program (8B down_proj 32.0 -> 28.3 us; 0.6B's,
    256 programs, stays at 4 rows: 4.5 us)."""
    if K >= 2048 and not gated:
        return 4, 2048, 4
    block_n = 4 if (K >= 2048 and N <= 4096) else (8 if N < 16384 else 16)
    if gated and block_n == 4 and N // block_n >= 512:
        block_n = 8
    block_k, warps = {4: (1024, 8), 8: (512, 4), 16: (256, 4)}[block_n]
    return block_n, min(block_k, max(16, triton.next_power_of_2(K))), warps


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  gated: bool = False) -> torch.Tensor:
    """x [1, K] (gated: [1, 2K] = [gate | up]) @ weight [N, K].T (+ bias) -> [1, N]."""
    return _skinny(x, weight, bias, gated=gated)[0]


def skinny_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                       zero_centered: bool, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """rms_norm(x [+ residual]) [1, K] @ weight.T (+ bias) -> (y [1, N], x + residual, or x without one)."""
    assert norm_weight.shape == (weight.shape[1],) and norm_weight.dtype == x.dtype, (norm_weight.shape, norm_weight.dtype)
    return _skinny(x, weight, bias, norm=(residual, norm_weight.contiguous(), eps, zero_centered))


def _skinny(x, weight, bias, gated=False, norm=None):
    N, K = weight.shape
    assert x.dim() == 2 and x.shape == (1, 2 * K if gated else K), (x.shape, weight.shape, gated)
    assert x.dtype in FLOATS and weight.dtype == x.dtype, (x.dtype, weight.dtype)
    assert not (gated and norm), "one prologue at a time"
    if x.stride(-1) != 1:
        x = x.contiguous()
    # a weight copied here is written by the kernel right before ours: no reading it before the wait
    prefetch = weight.stride(-1) == 1
    if not prefetch:
        weight = weight.contiguous()
    y = torch.empty((1, N), dtype=x.dtype, device=x.device)
    residual, norm_weight, eps, zero_centered = norm or (None, weight, 0.0, False)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, (residual.shape, residual.dtype)
        residual = residual.contiguous()
        s = torch.empty_like(x)
    else:
        s = x                                            # no add: the residual is the input itself
    block_n, block_k, warps = _skinny_config(N, K, gated)
    pdl = use_pdl(x) and prefetch
    _skinny_linear_kernel[(triton.cdiv(N, block_n),)](
        x, weight, bias if bias is not None else weight, y,
        residual if residual is not None else x, norm_weight, s, N, K, weight.stride(0), eps,
        HAS_BIAS=bias is not None, GATED=gated, NORM=norm is not None, HAS_RESIDUAL=residual is not None,
        ZERO_CENTERED=zero_centered, BLOCK_N=block_n, BLOCK_K=block_k, USE_PDL=pdl, num_warps=warps,
        launch_pdl=pdl,
    )
    return y, s
