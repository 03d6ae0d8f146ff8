"""Triton kernels for the decode engine's hot operations.

Each kernel comes with a plain Python wrapper whose signature is the one `kernels.dispatch` calls;
`kernels.reference` defines what each must compute, and tests/test_kernels.py checks them against it.
They are written for the GPU (H200) and also run on the CPU under the Triton interpreter
(TRITON_INTERPRET=1, set before `import triton`), which is how the tests run without a GPU.
On Hopper and later GPUs the kernels of a decode layer are launched with programmatic dependent
launch (see `_pdl`); TRITON_OMNI_PDL=0 in the environment (or `PDL = False`) turns that off.

    rms_norm                 (x [+ residual]) -> norm, fused add + norm, one row per program
    silu_and_mul             silu(gate) * up for a fused gate/up projection
    skinny_linear            x @ w.T (+ bias) for one row (batch-1 decode): weight-streaming, no split-K
                             reduction pass; optionally silu(gate) * up of its input on the fly
    skinny_norm_linear       the same with the input's (residual add +) RMSNorm folded in
    qk_norm_rope_store       per-head RMSNorm of q and k (optional), rotate-half RoPE (partial rotary
                             allowed) and the scatter of k/v into the paged caches (slot -1 skipped), one launch
    causal_conv1d_update     a decode step of the depthwise causal conv + silu, shifting each slot's window
    causal_conv1d_prefill    the same conv + silu over packed prompts, in one pass (prefill)
    gated_delta_decode       a decode step of Gated DeltaNet (l2-normed q/k, decay, delta-rule state update,
                             read-out) and its gated RMSNorm, one program per (sequence, value head)
    gated_delta_prefill      Gated DeltaNet over packed prompts (the chunked delta rule): one program per
                             (chunk, value head) for what a chunk gives alone, one per (prompt, value head,
                             value block) for the scan over its chunks
    paged_decode_attention   one query token per sequence over its paged context, GQA-grouped and
                             split across programs (flash-decoding) with a fixed number of splits
    argmax                   the first index of each row's maximum (greedy sampling over the vocabulary)
    decode_inputs            a decode step's inputs gathered from the engine's per-row state
    decode_finish            after sampling: stop check, finish codes, per-row state advanced
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from triton_omni.kernels import reference

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

# --------------------------------------------------------------------------------------------------
# Programmatic dependent launch (PDL, Hopper and later)
# --------------------------------------------------------------------------------------------------
#
# A batch-1 decode step is ~200 short kernels in a row (7 a layer), each only a few microseconds of
# weight reads: the gap between one kernel's end and the next one's start, and each kernel's ramp,
# are a large share of the step. Launched with PDL, a kernel may start while the one before it is
# still running: its programs first do what depends on no earlier kernel (the skinny matmuls load
# their first weight tile: no kernel of the step writes weights), then wait (`griddepcontrol.wait`:
# the earlier kernel has finished and its writes are visible), then allow the next kernel to start in
# turn. A kernel launched so must not touch any other tensor before that wait; kernels without it
# are launched the ordinary way. It holds inside CUDA graphs too (captured as programmatic edges).

# (the interpreter, chosen before triton is imported, runs no launch attributes)
PDL = os.environ.get("TRITON_OMNI_PDL", "1") != "0" and os.environ.get("TRITON_INTERPRET") != "1"


@functools.lru_cache(maxsize=None)
def _pdl_device(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def _pdl(x: torch.Tensor) -> bool:
    """Whether kernels on x's device are launched with PDL."""
    return PDL and x.is_cuda and _pdl_device(x.device)


@triton.jit
def _wait_for_earlier_kernels(USE_PDL: tl.constexpr):
    """The earlier kernels' writes are visible after this; the next kernel may start (PDL launches)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def _rows3(x: torch.Tensor) -> torch.Tensor:
    """View x [..., D] as [n0, n1, D] with a unit last stride, copying only when a view is impossible.

    Three dims cover the common strided inputs without a copy: [T, D] rows, and [T, H, D] heads cut
    out of a fused projection (e.g. `qkv.split(...)[0].view(T, H, D)`)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    if x.dim() > 3:
        return x.reshape(-1, *x.shape[-2:])
    return x


# --------------------------------------------------------------------------------------------------
# RMSNorm (optionally fused with the residual add)
# --------------------------------------------------------------------------------------------------

@triton.jit
def _residual_add(x, r):
    """x + residual, rounded to x's dtype (both the new residual and the norm's input)."""
    return (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)


@triton.jit
def _norm_scale(h, w, dtype, ZERO_CENTERED: tl.constexpr):
    """The normalised fp32 h times the norm weight (fp32), rounded as the reference rounds; fp32 out."""
    # one return at the end, as the kernels had it: the compiler need not follow returns in branches
    if ZERO_CENTERED:
        y = h * (1.0 + w)                                # (h * (1 + w.float())).to(x.dtype)
    else:
        y = w * h.to(dtype).to(tl.float32)               # weight * h.to(x.dtype), in the promoted dtype
    return y


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, s_ptr,
    n_rows, n1, stride_x0, stride_x1, stride_r0, stride_r1,
    D, eps,
    HAS_RESIDUAL: tl.constexpr, ZERO_CENTERED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    _wait_for_earlier_kernels(USE_PDL)
    # BLOCK_M rows a program (several for short rows such as per-head norms, one for hidden states)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    i, j = rows // n1, rows % n1                          # row -> (outer, inner) index of the [n0, n1, D] view
    offs = tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (offs < D)[None, :]
    out_offs = rows[:, None] * D + offs[None, :]          # outputs are contiguous

    x = tl.load(x_ptr + (i * stride_x0 + j * stride_x1)[:, None] + offs[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # s = x + residual, rounded to x's dtype; it is both the new residual and the norm's input
        r = tl.load(res_ptr + (i * stride_r0 + j * stride_r1)[:, None] + offs[None, :], mask=mask, other=0.0)
        x = _residual_add(x, r)
        tl.store(s_ptr + out_offs, x, mask=mask)

    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=1) / D + eps)[:, None]
    w = tl.load(w_ptr + offs, mask=offs < D, other=0.0).to(tl.float32)[None, :]
    y = _norm_scale(h, w, x.dtype, ZERO_CENTERED)
    tl.store(y_ptr + out_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             zero_centered: bool = False):
    """norm(x [+ residual]) over the last dim; returns (y, x + residual) when a residual is given."""
    D = x.shape[-1]
    assert x.dtype in _FLOATS and weight.shape == (D,), (x.dtype, weight.shape, D)
    assert weight.device == x.device
    weight = weight.contiguous()
    # the reference multiplies `weight * h.to(x.dtype)`, so the output takes the promoted dtype
    out_dtype = x.dtype if zero_centered else torch.promote_types(weight.dtype, x.dtype)
    x3 = _rows3(x)
    n0, n1 = x3.shape[0], x3.shape[1]
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, (residual.shape, residual.dtype)
        r3 = _rows3(residual)
        s = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        r3, s = x3, y                                     # unused (HAS_RESIDUAL=False)
    if x.numel() == 0:
        return y if residual is None else (y, s)

    n_rows = n0 * n1
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_M = min(triton.next_power_of_2(n_rows), max(1, 2048 // BLOCK_D))   # ~2K elements a program
    num_warps = min(max(BLOCK_M * BLOCK_D // 512, 1), 16)                    # ~16 a thread; 8 warps at D=4096
    pdl = _pdl(x)
    _rms_norm_kernel[(triton.cdiv(n_rows, BLOCK_M),)](
        x3, r3, weight, y, s,
        n_rows, n1, x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1),
        D, eps,
        HAS_RESIDUAL=residual is not None, ZERO_CENTERED=zero_centered, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D,
        USE_PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
    )
    return y if residual is None else (y, s)


# --------------------------------------------------------------------------------------------------
# SiLU-and-mul (gated MLP activation)
# --------------------------------------------------------------------------------------------------

@triton.jit
def _silu_mul(gate, up):
    """silu(gate) * up in gate's dtype, rounded as the unfused pair rounds."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)       # F.silu rounds to the input dtype ...
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)   # ... then the product again


@triton.jit
def _silu_and_mul_kernel(x_ptr, y_ptr, stride_x, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + I + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * I + offs, _silu_mul(gate, up), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:]  ([..., I], x's dtype)."""
    assert x.dtype in _FLOATS and x.shape[-1] % 2 == 0, (x.dtype, x.shape)
    I = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * I)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((*x.shape[:-1], I), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    BLOCK = min(triton.next_power_of_2(I), 1024)
    _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(I, BLOCK))](x2, y, x2.stride(0), I, BLOCK=BLOCK, num_warps=4)
    return y


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
        x = _silu_mul(x, tl.load(x_ptr + K + kk, mask=kmask, other=0.0))
    if NORM:
        if HAS_RESIDUAL:
            x = _residual_add(x, tl.load(res_ptr + kk, mask=kmask, other=0.0))
        nw = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        x = _norm_scale(x.to(tl.float32) * rstd, nw, x.dtype, ZERO_CENTERED).to(x.dtype)
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
    _wait_for_earlier_kernels(USE_PDL)
    rstd = 1.0
    if NORM:
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + k
            kmask = kk < K
            x = tl.load(x_ptr + kk, mask=kmask, other=0.0)
            if HAS_RESIDUAL:
                x = _residual_add(x, tl.load(res_ptr + kk, mask=kmask, other=0.0))
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
    assert x.dtype in _FLOATS and weight.dtype == x.dtype, (x.dtype, weight.dtype)
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
    pdl = _pdl(x) and prefetch
    _skinny_linear_kernel[(triton.cdiv(N, block_n),)](
        x, weight, bias if bias is not None else weight, y,
        residual if residual is not None else x, norm_weight, s, N, K, weight.stride(0), eps,
        HAS_BIAS=bias is not None, GATED=gated, NORM=norm is not None, HAS_RESIDUAL=residual is not None,
        ZERO_CENTERED=zero_centered, BLOCK_N=block_n, BLOCK_K=block_k, USE_PDL=pdl, num_warps=warps,
        launch_pdl=pdl,
    )
    return y, s


# --------------------------------------------------------------------------------------------------
# q/k RMSNorm + rotary + KV-cache write, fused (one launch where the unfused path takes four)
# --------------------------------------------------------------------------------------------------
#
# Program (t, j): token t, heads j*BLOCK_H ... of the q heads followed by the k heads. Every head is
# read as its rotated halves plus the pass-through rest, normalised over all three, rotated, written;
# k heads also write themselves and their v head into the caches (slot -1: padding, no write).
# Rounding follows the unfused reference: norm output rounded to the input dtype, then rotary.

@triton.jit
def _qk_norm_rope_store_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, ko_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, kc_ptr, vc_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_sin,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    Hq, Hk, D, HALF, block_size, eps,
    HAS_NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr, HAS_REST: tl.constexpr, USE_PDL: tl.constexpr,
):
    _wait_for_earlier_kernels(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    is_q = heads < Hq
    is_k = (heads >= Hq) & (heads < Hq + Hk)
    hk = heads - Hq

    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    keep = slot >= 0
    slot = tl.maximum(slot, 0)
    cache_block, cache_row = slot // block_size, slot % block_size

    offs = tl.arange(0, BLOCK_HALF)
    dmask = offs < HALF
    offs_r = 2 * HALF + tl.arange(0, BLOCK_REST)
    rmask = offs_r < D
    mq, mk = is_q[:, None] & dmask[None, :], is_k[:, None] & dmask[None, :]
    mqr, mkr = is_q[:, None] & rmask[None, :], is_k[:, None] & rmask[None, :]
    q_in = q_ptr + t * stride_qt + heads[:, None] * stride_qh
    k_in = k_ptr + t * stride_kt + hk[:, None] * stride_kh

    x1 = tl.where(mq, tl.load(q_in + offs[None, :], mask=mq, other=0.0),
                  tl.load(k_in + offs[None, :], mask=mk, other=0.0))
    x2 = tl.where(mq, tl.load(q_in + HALF + offs[None, :], mask=mq, other=0.0),
                  tl.load(k_in + HALF + offs[None, :], mask=mk, other=0.0))
    if HAS_REST:
        xr = tl.where(mqr, tl.load(q_in + offs_r[None, :], mask=mqr, other=0.0),
                      tl.load(k_in + offs_r[None, :], mask=mkr, other=0.0))
    dtype = x1.dtype

    if HAS_NORM:
        h1, h2 = x1.to(tl.float32), x2.to(tl.float32)
        ss = tl.sum(h1 * h1, axis=1) + tl.sum(h2 * h2, axis=1)
        if HAS_REST:
            hr = xr.to(tl.float32)
            ss += tl.sum(hr * hr, axis=1)
        inv = tl.rsqrt(ss / D + eps)[:, None]
        qsel = is_q[:, None]
        w1 = tl.where(qsel, tl.load(qw_ptr + offs, mask=dmask, other=0.0)[None, :],
                      tl.load(kw_ptr + offs, mask=dmask, other=0.0)[None, :]).to(tl.float32)
        w2 = tl.where(qsel, tl.load(qw_ptr + HALF + offs, mask=dmask, other=0.0)[None, :],
                      tl.load(kw_ptr + HALF + offs, mask=dmask, other=0.0)[None, :]).to(tl.float32)
        if ZERO_CENTERED:
            x1 = (h1 * inv * (1.0 + w1)).to(dtype)
            x2 = (h2 * inv * (1.0 + w2)).to(dtype)
        else:
            x1 = (w1 * (h1 * inv).to(dtype).to(tl.float32)).to(dtype)
            x2 = (w2 * (h2 * inv).to(dtype).to(tl.float32)).to(dtype)
        if HAS_REST:
            wr = tl.where(qsel, tl.load(qw_ptr + offs_r, mask=rmask, other=0.0)[None, :],
                          tl.load(kw_ptr + offs_r, mask=rmask, other=0.0)[None, :]).to(tl.float32)
            if ZERO_CENTERED:
                xr = (hr * inv * (1.0 + wr)).to(dtype)
            else:
                xr = (wr * (hr * inv).to(dtype).to(tl.float32)).to(dtype)

    c = tl.load(cos_ptr + pos * stride_cos + offs, mask=dmask, other=0.0)[None, :]
    s = tl.load(sin_ptr + pos * stride_sin + offs, mask=dmask, other=0.0)[None, :]
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    o1 = (x1f * c - x2f * s).to(dtype)
    o2 = (x2f * c + x1f * s).to(dtype)

    q_out = qo_ptr + t * Hq * D + heads[:, None] * D
    k_out = ko_ptr + t * Hk * D + hk[:, None] * D
    kc = kc_ptr + cache_block * stride_kcb + cache_row * stride_kcs + hk[:, None] * stride_kch
    mkc, mkrc = mk & keep, mkr & keep
    tl.store(q_out + offs[None, :], o1, mask=mq)
    tl.store(q_out + HALF + offs[None, :], o2, mask=mq)
    tl.store(k_out + offs[None, :], o1, mask=mk)
    tl.store(k_out + HALF + offs[None, :], o2, mask=mk)
    tl.store(kc + offs[None, :], o1, mask=mkc)
    tl.store(kc + HALF + offs[None, :], o2, mask=mkc)
    if HAS_REST:
        tl.store(q_out + offs_r[None, :], xr, mask=mqr)
        tl.store(k_out + offs_r[None, :], xr, mask=mkr)
        tl.store(kc + offs_r[None, :], xr, mask=mkrc)

    # v: copied as it is, by the programs of the k heads
    v_in = v_ptr + t * stride_vt + hk[:, None] * stride_vh
    vc = vc_ptr + cache_block * stride_vcb + cache_row * stride_vcs + hk[:, None] * stride_vch
    tl.store(vc + offs[None, :], tl.load(v_in + offs[None, :], mask=mkc, other=0.0), mask=mkc)
    tl.store(vc + HALF + offs[None, :], tl.load(v_in + HALF + offs[None, :], mask=mkc, other=0.0), mask=mkc)
    if HAS_REST:
        tl.store(vc + offs_r[None, :], tl.load(v_in + offs_r[None, :], mask=mkrc, other=0.0), mask=mkrc)


def qk_norm_rope_store(q, k, v, q_weight, k_weight, eps, zero_centered, cos, sin, positions,
                       k_cache, v_cache, slot_mapping):
    """q [T, Hq, D], k/v [T, Hk, D] (strided views are fine); q_weight/k_weight [D] or None (no norm)
    -> new contiguous (q, k), normalised and rotated; k (rotated) and v written into the caches."""
    T, Hq, D = q.shape
    Hk = k.shape[1]
    half = cos.shape[-1]
    assert k.shape == v.shape == (T, Hk, D) and k.dtype == v.dtype == q.dtype and q.dtype in _FLOATS
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape and 2 * half <= D
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (Hk, D) and k_cache.dtype == q.dtype
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "cache head_dim must be contiguous"
    assert positions.shape == slot_mapping.shape == (T,)
    has_norm = q_weight is not None
    if has_norm:
        assert q_weight.shape == k_weight.shape == (D,) and q_weight.dtype == k_weight.dtype == q.dtype
        q_weight, k_weight = q_weight.contiguous(), k_weight.contiguous()
    else:
        q_weight = k_weight = cos                          # unused
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    cos, sin = cos.contiguous(), sin.contiguous()
    q_out = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    k_out = torch.empty((T, Hk, D), dtype=k.dtype, device=k.device)
    if T == 0:
        return q_out, k_out
    BLOCK_HALF = triton.next_power_of_2(half)
    BLOCK_REST = triton.next_power_of_2(max(D - 2 * half, 1))
    BLOCK_H = min(triton.next_power_of_2(Hq + Hk), max(1, 2048 // (2 * BLOCK_HALF)))
    pdl = _pdl(q)
    _qk_norm_rope_store_kernel[(T, triton.cdiv(Hq + Hk, BLOCK_H))](
        q, k, v, q_out, k_out, q_weight, k_weight, cos, sin, positions.contiguous(), slot_mapping.contiguous(),
        k_cache, v_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        Hq, Hk, D, half, k_cache.shape[1], eps,
        HAS_NORM=has_norm, ZERO_CENTERED=zero_centered, BLOCK_H=BLOCK_H, BLOCK_HALF=BLOCK_HALF,
        BLOCK_REST=BLOCK_REST, HAS_REST=2 * half < D, USE_PDL=pdl, num_warps=4, launch_pdl=pdl,
    )
    return q_out, k_out


# --------------------------------------------------------------------------------------------------
# Gated DeltaNet decode (Qwen3.5's linear-attention layers)
# --------------------------------------------------------------------------------------------------
# Both kernels are launched with PDL like the rest of the step: everything they read comes from the
# kernel before them, so they wait first. H200, Qwen3.5-0.8B shape, c=1: 0.866 -> 0.858-0.861 ms a
# token (in-process, three samples each, runs before and after the one without).

@triton.jit
def _conv1d_update_kernel(x_ptr, state_ptr, w_ptr, y_ptr, slot_ptr, C, stride_xb, stride_ss, stride_sc, stride_wc,
                          K: tl.constexpr, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr):
    _wait_for_earlier_kernels(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    slot = tl.load(slot_ptr + b).to(tl.int64)
    row = state_ptr + slot * stride_ss + c * stride_sc
    x = tl.load(x_ptr + b * stride_xb + c, mask=cmask, other=0.0)
    acc = x.to(tl.float32) * tl.load(w_ptr + c * stride_wc + (K - 1), mask=cmask, other=0.0).to(tl.float32)
    prev = tl.load(row, mask=cmask, other=0.0)                      # the oldest tap: read, not kept
    for j in tl.static_range(K - 1):
        acc += prev.to(tl.float32) * tl.load(w_ptr + c * stride_wc + j, mask=cmask, other=0.0).to(tl.float32)
        if j < K - 2:
            prev = tl.load(row + (j + 1), mask=cmask, other=0.0)
            tl.store(row + j, prev, mask=cmask)                     # shift the window left by one
    tl.store(row + (K - 2), x.to(state_ptr.dtype.element_ty), mask=cmask)
    h = acc.to(x.dtype).to(tl.float32)                              # the conv's output dtype, then silu
    tl.store(y_ptr + b * C + c, (h / (1.0 + tl.exp(-h))).to(y_ptr.dtype.element_ty), mask=cmask)


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         slots: torch.Tensor) -> torch.Tensor:
    """x [B, C] (rows may be strided), conv_state [S, C, K-1] (in place), weight [C, K] -> silu(conv) [B, C]."""
    B, C = x.shape
    K = weight.shape[1]
    assert conv_state.shape[1:] == (C, K - 1) and K >= 2 and conv_state.stride(-1) == 1 and weight.stride(-1) == 1
    assert x.stride(-1) == 1 and slots.shape == (B,)
    y = torch.empty((B, C), dtype=x.dtype, device=x.device)
    if B == 0:
        return y
    BLOCK_C = 256
    pdl = _pdl(x)
    _conv1d_update_kernel[(B, triton.cdiv(C, BLOCK_C))](
        x, conv_state, weight, y, slots.contiguous(), C, x.stride(0), conv_state.stride(0), conv_state.stride(1),
        weight.stride(0), K=K, BLOCK_C=BLOCK_C, USE_PDL=pdl, num_warps=4, launch_pdl=pdl)
    return y


@triton.jit
def _conv1d_prefill_kernel(x_ptr, w_ptr, pos_ptr, y_ptr, T, C, stride_xt, stride_wc,
                           K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    tmask, cmask = t < T, c < C
    pos = tl.load(pos_ptr + t, mask=tmask, other=0)
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(K):
        back = K - 1 - j                                            # tap j reads the token `back` rows up
        valid = tmask & (pos >= back)                               # ... if it is in the same prompt
        x = tl.load(x_ptr + (t - back).to(tl.int64)[:, None] * stride_xt + c[None, :],
                    mask=valid[:, None] & cmask[None, :], other=0.0)
        acc += x.to(tl.float32) * tl.load(w_ptr + c * stride_wc + j, mask=cmask, other=0.0).to(tl.float32)[None, :]
    h = acc.to(y_ptr.dtype.element_ty).to(tl.float32)               # the conv's output dtype, then silu
    tl.store(y_ptr + t.to(tl.int64)[:, None] * C + c[None, :], (h / (1.0 + tl.exp(-h))).to(y_ptr.dtype.element_ty),
             mask=tmask[:, None] & cmask[None, :])


def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [T, C] (rows may be strided), weight [C, K], positions [T] -> silu(conv) [T, C]: one pass over x
    (torch's path builds [T, K, C] windows and an einsum: ~9.5 ms a layer for 64 prompts of 512
    tokens of the Qwen3.5-0.8B shape on an H200)."""
    T, C = x.shape
    K = weight.shape[1]
    assert x.stride(-1) == 1 and weight.stride(-1) == 1 and positions.shape == (T,)
    y = torch.empty((T, C), dtype=x.dtype, device=x.device)
    if T == 0:
        return y
    BLOCK_T, BLOCK_C = 16, 256
    _conv1d_prefill_kernel[(triton.cdiv(T, BLOCK_T), triton.cdiv(C, BLOCK_C))](
        x, weight, positions.contiguous(), y, T, C, x.stride(0), weight.stride(0),
        K=K, BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, num_warps=4)
    return y


@triton.jit
def _delta_gates(a, b, alog_ptr, dtb_ptr, h):
    """Gated DeltaNet's write strength beta = sigmoid(b) (rounded to b's dtype, as the model computes it)
    and log decay g = -exp(A_log[h]) * softplus(a + dt_bias[h]), both fp32, from the raw projections."""
    beta = (1.0 / (1.0 + tl.exp(-b.to(tl.float32)))).to(b.dtype).to(tl.float32)
    x = a.to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    return beta, -tl.exp(tl.load(alog_ptr + h).to(tl.float32)) * softplus


@triton.jit
def _gated_delta_decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, state_ptr, slot_ptr, z_ptr, nw_ptr, out_ptr,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ab, stride_bb, stride_zb, stride_zh,
    stride_ss, stride_sh, DK, DV, REP, q_scale, eps,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, USE_PDL: tl.constexpr,
):
    _wait_for_earlier_kernels(USE_PDL)
    bi = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    hk = h // REP
    kd = tl.arange(0, BLOCK_K)
    vd = tl.arange(0, BLOCK_V)
    kmask, vmask = kd < DK, vd < DV
    slot = tl.load(slot_ptr + bi).to(tl.int64)

    q = tl.load(q_ptr + bi * stride_qb + hk * stride_qh + kd, mask=kmask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + bi * stride_kb + hk * stride_kh + kd, mask=kmask, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * q_scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    v_raw = tl.load(v_ptr + bi * stride_vb + h * stride_vh + vd, mask=vmask, other=0.0)
    v = v_raw.to(tl.float32)

    beta, g = _delta_gates(tl.load(a_ptr + bi * stride_ab + h), tl.load(b_ptr + bi * stride_bb + h), alog_ptr,
                           dtb_ptr, h)

    s_ptrs = state_ptr + slot * stride_ss + h * stride_sh + kd[:, None] * DV + vd[None, :]
    smask = kmask[:, None] & vmask[None, :]
    S = tl.load(s_ptrs, mask=smask, other=0.0) * tl.exp(g)
    delta = (v - tl.sum(k[:, None] * S, axis=0)) * beta
    S = S + k[:, None] * delta[None, :]
    tl.store(s_ptrs, S, mask=smask)
    o = tl.sum(q[:, None] * S, axis=0).to(v_raw.dtype).to(tl.float32)

    # gated RMSNorm over the head: weight * norm(o) in the model dtype, times silu(z)
    o = o * tl.rsqrt(tl.sum(tl.where(vmask, o * o, 0.0), axis=0) / DV + eps)
    w = tl.load(nw_ptr + vd, mask=vmask, other=0.0)
    y = (w.to(tl.float32) * o.to(v_raw.dtype).to(tl.float32)).to(w.dtype).to(tl.float32)
    z = tl.load(z_ptr + bi * stride_zb + h * stride_zh + vd, mask=vmask, other=0.0).to(tl.float32)
    y = y * (z / (1.0 + tl.exp(-z)))
    tl.store(out_ptr + (bi * (tl.num_programs(1)) + h) * DV + vd, y.to(out_ptr.dtype.element_ty), mask=vmask)


def gated_delta_decode(q, k, v, a, b, A_log, dt_bias, state, slots, z, norm_weight, eps):
    """See kernels.reference.gated_delta_decode. Strided head views are fine (unit last stride)."""
    B, Hk, DK = q.shape
    Hv, DV = v.shape[1], v.shape[2]
    assert k.shape == q.shape and z.shape == v.shape and a.shape == b.shape == (B, Hv) and Hv % Hk == 0
    assert state.shape[1:] == (Hv, DK, DV) and state.dtype == torch.float32 and state.stride(-1) == 1
    assert state.stride(-2) == DV and norm_weight.dtype == v.dtype
    assert all(t.stride(-1) == 1 for t in (q, k, v, z, a, b))
    out = torch.empty((B, Hv, DV), dtype=v.dtype, device=v.device)
    if B == 0:
        return out
    pdl = _pdl(v)
    _gated_delta_decode_kernel[(B, Hv)](
        q, k, v, a, b, A_log, dt_bias, state, slots.contiguous(), z, norm_weight.contiguous(), out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        z.stride(0), z.stride(1), state.stride(0), state.stride(1), DK, DV, Hv // Hk, DK ** -0.5, eps,
        BLOCK_K=triton.next_power_of_2(DK), BLOCK_V=triton.next_power_of_2(DV), USE_PDL=pdl, num_warps=8,
        launch_pdl=pdl,
    )
    return out


# --------------------------------------------------------------------------------------------------
# Gated DeltaNet prefill: the chunked delta rule in two kernels
# --------------------------------------------------------------------------------------------------
#
# kernels.reference.chunk_gated_delta_rule defines the algorithm. Its torch form packs the chunks into
# padded [N, H, C, .] tensors, solves N*H unit-triangular systems and scans the chunks step by step,
# several launches a step: for one 512-token prompt of the Qwen3.5-0.8B shape ~90 torch ops a layer
# (counted with torch's profiler on a CPU), and at 64 prompts most of its GPU time goes to the copies
# that pack and unpack. Here the chunks are read where they lie in the packed rows (chunk m of prompt
# s starts at token cu[s] + m * C), numbered prompt by prompt:
#   _gated_delta_chunk_kernel  program (chunk, value head): all that the chunk's own tokens give, from
#       the raw conv outputs and projections (l2-normed q/k, beta, g): the cumulative log decay G,
#       (I + A)^-1 by forward substitution, Wv, Wk, O0 (written to the output rows), E, KG and the
#       chunk's total decay, into per-chunk buffers padded to BLOCK_K / BLOCK_V columns (zeros).
#   _gated_delta_scan_kernel   program (prompt, value head, block of dv): the prompt's chunks in order
#       with its state block in registers: O += E S, U = Wv - Wk S, S = decay S + KG^T U; the last S
#       straight into the prompt's state slot.
# Products are fp32 at full precision (no tf32), as the torch path's. The chunk table is built on the
# device from cu_seqlens and the grids are sized from shapes alone (programs past the last chunk, and
# prompts of no tokens, return at once), so a prefill CUDA graph can hold both launches.

@triton.jit
def _gated_delta_chunk_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, cu_ptr, first_ptr, seq_ptr,
    wv_ptr, wk_ptr, e_ptr, kg_ptr, decay_ptr, o_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_bt, stride_ot, stride_oh,
    S, H, DK, DV, REP, q_scale,
    C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.load(seq_ptr + n)
    if s >= S:                                                  # past the last chunk
        return
    start = tl.load(cu_ptr + s) + (n - tl.load(first_ptr + s)) * C
    t = tl.arange(0, C)
    valid = start + t < tl.load(cu_ptr + s + 1)
    rows = (start + t).to(tl.int64)
    kd, vd = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_V)
    kmask, vmask = valid[:, None] & (kd < DK)[None, :], valid[:, None] & (vd < DV)[None, :]
    hk = h // REP
    q = tl.load(q_ptr + rows[:, None] * stride_qt + hk * stride_qh + kd[None, :], mask=kmask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + rows[:, None] * stride_kt + hk * stride_kh + kd[None, :], mask=kmask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + rows[:, None] * stride_vt + h * stride_vh + vd[None, :], mask=vmask, other=0.0).to(tl.float32)
    q = q * (tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6) * q_scale)[:, None]
    k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
    beta, g = _delta_gates(tl.load(a_ptr + rows * stride_at + h, mask=valid, other=0.0),
                           tl.load(b_ptr + rows * stride_bt + h, mask=valid, other=0.0), alog_ptr, dtb_ptr, h)
    # slots past the prompt's end: beta = 0 and g = 0 (with k = v = 0) leave the state as it is
    beta = tl.where(valid, beta, 0.0)
    g = tl.where(valid, g, 0.0)
    G = tl.cumsum(g, axis=0)                                    # log decay since the chunk's start

    r, c = t[:, None], t[None, :]
    # D[r, c] = Gamma_r / Gamma_c for c <= r, else 0 (masked before exp: above the diagonal it may overflow)
    D = tl.exp(tl.where(c <= r, G[:, None] - G[None, :], float("-inf")))
    # the substitution reads A's rows as columns, so A is built transposed: AT[j, i] = A[i, j]
    #   = beta_i (k_i . k_j) Gamma_i / Gamma_j for j < i
    KK = tl.dot(k, tl.trans(k), input_precision="ieee")
    AT = KK * tl.exp(tl.where(r < c, G[None, :] - G[:, None], float("-inf"))) * beta[None, :]
    # Tinv = (I + A)^-1, row by row: Tinv_i = e_i - sum_{j < i} A[i, j] Tinv_j
    Tinv = tl.where(r == c, 1.0, 0.0)
    for i in range(1, C):
        a_i = tl.sum(tl.where(c == i, AT, 0.0), axis=1)                        # A[i, :] along rows
        Tinv -= tl.where(r == i, tl.sum(a_i[:, None] * Tinv, axis=0)[None, :], 0.0)
    gamma = tl.exp(G)
    Wv = tl.dot(Tinv, v * beta[:, None], input_precision="ieee")                              # [C, BLOCK_V]
    Wk = tl.dot(Tinv, k * (beta * gamma)[:, None], input_precision="ieee")                   # [C, BLOCK_K]
    P = tl.dot(q, tl.trans(k), input_precision="ieee") * D
    tl.store(o_ptr + rows[:, None] * stride_ot + h * stride_oh + vd[None, :],
             tl.dot(P, Wv, input_precision="ieee"), mask=vmask)
    E = q * gamma[:, None] - tl.dot(P, Wk, input_precision="ieee")
    total = tl.sum(tl.where(t == C - 1, G, 0.0), axis=0)     # G at the chunk's end, as the reference's
    KG = k * tl.exp(total - G)[:, None]
    base = (n * H + h).to(tl.int64) * C + t
    tl.store(wv_ptr + base[:, None] * BLOCK_V + vd[None, :], Wv)
    tl.store(wk_ptr + base[:, None] * BLOCK_K + kd[None, :], Wk)
    tl.store(e_ptr + base[:, None] * BLOCK_K + kd[None, :], E)
    tl.store(kg_ptr + base[:, None] * BLOCK_K + kd[None, :], KG)
    tl.store(decay_ptr + n * H + h, tl.exp(total))


@triton.jit
def _gated_delta_scan_kernel(
    wv_ptr, wk_ptr, e_ptr, kg_ptr, decay_ptr, o_ptr, state_ptr, slot_ptr, cu_ptr, first_ptr,
    stride_ot, stride_oh, stride_ss, stride_sh, H, DK, DV,
    C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, SPLIT_V: tl.constexpr,
):
    s = tl.program_id(0)
    h = tl.program_id(1)
    first = tl.load(first_ptr + s)
    count = tl.load(first_ptr + s + 1) - first
    if count == 0:                                              # no prompt here: its slot is left alone
        return
    start, end = tl.load(cu_ptr + s), tl.load(cu_ptr + s + 1)
    t, kd = tl.arange(0, C), tl.arange(0, BLOCK_K)
    vd = tl.program_id(2) * SPLIT_V + tl.arange(0, SPLIT_V)
    S = tl.zeros([BLOCK_K, SPLIT_V], dtype=tl.float32)
    for m in range(0, count):
        base = ((first + m) * H + h).to(tl.int64) * C + t
        ck = base[:, None] * BLOCK_K + kd[None, :]
        rows = start + m * C + t
        omask = (rows < end)[:, None] & (vd < DV)[None, :]
        o_ptrs = o_ptr + rows.to(tl.int64)[:, None] * stride_ot + h * stride_oh + vd[None, :]
        o = tl.load(o_ptrs, mask=omask, other=0.0) + tl.dot(tl.load(e_ptr + ck), S, input_precision="ieee")
        tl.store(o_ptrs, o, mask=omask)
        U = tl.load(wv_ptr + base[:, None] * BLOCK_V + vd[None, :]) - tl.dot(tl.load(wk_ptr + ck), S,
                                                                             input_precision="ieee")
        S = S * tl.load(decay_ptr + (first + m) * H + h) + tl.dot(tl.trans(tl.load(kg_ptr + ck)), U,
                                                                  input_precision="ieee")
    smask = (kd < DK)[:, None] & (vd < DV)[None, :]
    head = state_ptr + tl.load(slot_ptr + s).to(tl.int64) * stride_ss + h * stride_sh
    tl.store(head + kd[:, None] * DV + vd[None, :], S, mask=smask)


@dataclass
class GatedDeltaChunks:
    """The packed prompts' chunks for gated_delta_prefill, numbered prompt by prompt: prompt s has
    tokens cu[s] .. cu[s+1] - 1 and chunks first[s] .. first[s+1] - 1; seq[n] is chunk n's prompt, S
    for the table's spare entries past the last chunk."""
    cu: torch.Tensor              # [S + 1] int32
    first: torch.Tensor           # [S + 1] int32
    seq: torch.Tensor             # [N] int32: N from shapes, at least the chunk count
    chunk_size: int

    @classmethod
    def of(cls, cu_seqlens: torch.Tensor, num_tokens: int, chunk_size: int = reference.DELTA_CHUNK) -> "GatedDeltaChunks":
        """From the prompts' cu_seqlens [S + 1] on the device, with no host sync (a CUDA graph may hold
        it); `num_tokens` bounds cu_seqlens[-1]. Prompts may be empty; tokens past the last prompt belong
        to none. A prompt of length L has ceil(L / C) <= L // C + 1 chunks: N = num_tokens // C + S."""
        cu = cu_seqlens.int()
        counts = (cu[1:] - cu[:-1] + chunk_size - 1) // chunk_size
        first = torch.cat([cu.new_zeros(1), counts.cumsum(0).int()])
        n = torch.arange(num_tokens // chunk_size + len(counts), dtype=torch.int32, device=cu.device)
        seq = torch.searchsorted(first[1:], n, right=True).int()
        return cls(cu, first, seq, chunk_size)


SCAN_SPLIT_V = 64           # value columns per scan program (the state block it keeps in registers)


def gated_delta_prefill(q, k, v, a, b, A_log, dt_bias, chunks: GatedDeltaChunks, state: torch.Tensor,
                        slots: torch.Tensor) -> torch.Tensor:
    """See kernels.reference.gated_delta_prefill (the same inputs, with a GatedDeltaChunks for the
    layout); prompt s's last state goes straight to state[slots[s]] (state [num_slots, Hv, dk, dv] fp32,
    slots [S]; an empty prompt's slot is left alone). Returns the outputs [T, Hv, dv] fp32 (rows of no
    prompt are left unwritten). Strided row and head views are fine. Two launches whatever the prompts."""
    T, Hk, DK = q.shape
    H, DV = v.shape[1], v.shape[2]
    S, N, C = len(chunks.cu) - 1, len(chunks.seq), chunks.chunk_size
    assert k.shape == q.shape and v.shape[0] == T and a.shape == b.shape == (T, H) and H % Hk == 0
    assert slots.shape == (S,) and state.shape[1:] == (H, DK, DV) and state.dtype == torch.float32
    assert state.stride(-1) == 1 and state.stride(-2) == DV
    # (torch's conv on a CPU returns its output column-major)
    q, k, v, a, b = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, a, b))
    BLOCK_K, BLOCK_V = max(16, triton.next_power_of_2(DK)), max(16, triton.next_power_of_2(DV))
    f32 = dict(dtype=torch.float32, device=q.device)
    o = torch.empty((T, H, DV), **f32)
    if N == 0:
        return o
    wv = torch.empty((N, H, C, BLOCK_V), **f32)
    wk, e, kg = (torch.empty((N, H, C, BLOCK_K), **f32) for _ in range(3))
    decay = torch.empty((N, H), **f32)
    _gated_delta_chunk_kernel[(N, H)](
        q, k, v, a, b, A_log, dt_bias, chunks.cu, chunks.first, chunks.seq, wv, wk, e, kg, decay, o,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        o.stride(0), o.stride(1), S, H, DK, DV, H // Hk, DK ** -0.5,
        C=C, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps=8)
    split = min(BLOCK_V, SCAN_SPLIT_V)
    _gated_delta_scan_kernel[(S, H, BLOCK_V // split)](
        wv, wk, e, kg, decay, o, state, slots.contiguous(), chunks.cu, chunks.first, o.stride(0), o.stride(1),
        state.stride(0), state.stride(1), H, DK, DV,
        C=C, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, SPLIT_V=split, num_warps=4)
    return o


# --------------------------------------------------------------------------------------------------
# Paged decode attention (flash-decoding)
# --------------------------------------------------------------------------------------------------
#
# Program (b, kv head, split): the GROUP query heads that share this kv head, against this split's
# share of sequence b's context. K/V are read once per group; the group's query rows are padded to
# at least 16 so that both products run on tensor cores. The context is split NUM_SPLITS ways, in
# whole tiles of BLOCK_N tokens, from the sequence's own context_lens[b] (no host-side max length, so
# the launch is CUDA-graph safe); splits past the end do nothing. With one split the program writes
# the output directly; otherwise each split writes its normalised partial output and log-sum-exp and
# a second kernel combines them. (Combining them in the split that finishes last, counted with an
# atomic, instead of a second launch was slower: H200, Qwen3-0.6B c=1, 0.785 -> 0.829 ms a token. So was
# folding qk_norm_rope_store in, every program forming its q heads and the split holding the new token
# writing its k/v into the caches: 0.776 -> 0.800 ms a token, same run.)

@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_o_ptr, part_lse_ptr,
    qk_scale,                                             # softmax scale * log2(e): we use exp2
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt,
    Hq, D,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    _wait_for_earlier_kernels(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    ctx_len = tl.load(context_lens_ptr + b)
    tokens_per_split = tl.cdiv(tl.cdiv(ctx_len, NUM_SPLITS), BLOCK_N) * BLOCK_N   # whole tiles
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, ctx_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + g                               # the query heads of this kv group
    gmask = g < GROUP
    dmask = d < D
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)   # running max (log2 units)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)                  # running softmax denominator
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    block_row = block_tables_ptr + b * stride_bt
    k_head = k_cache_ptr + kvh * stride_kh
    v_head = v_cache_ptr + kvh * stride_vh

    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        # token n lives in block block_tables[b, n // BLOCK_SIZE], row n % BLOCK_SIZE
        block = tl.load(block_row + n // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
        row = n % BLOCK_SIZE
        kv_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(k_head + block[:, None] * stride_kb + row[:, None] * stride_ks + d[None, :],
                    mask=kv_mask, other=0.0)
        # v is loaded before the softmax so that both loads are in flight together
        v = tl.load(v_head + block[:, None] * stride_vb + row[:, None] * stride_vs + d[None, :],
                    mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale   # [BLOCK_G, BLOCK_N]
        s = tl.where(nmask[None, :], s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    has_tokens = l_i > 0.0                                # false for an empty split (or context)
    o = acc / tl.where(has_tokens, l_i, 1.0)[:, None]     # zeros where empty, never NaN
    out_mask = gmask[:, None] & dmask[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # partials: o [B, Hq, NUM_SPLITS, D], lse [B, Hq, NUM_SPLITS], fp32, contiguous
        part_row = (b * Hq + heads) * NUM_SPLITS + split
        lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part_row, lse, mask=gmask)
        tl.store(part_o_ptr + part_row[:, None] * D + d[None, :], o, mask=out_mask)


@triton.jit
def _paged_decode_reduce_kernel(
    part_o_ptr, part_lse_ptr, out_ptr,
    stride_ob, stride_oh, Hq, D,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):
    _wait_for_earlier_kernels(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    part_row = (b * Hq + h) * NUM_SPLITS
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    smask = sp < NUM_SPLITS
    lse = tl.load(part_lse_ptr + part_row + sp, mask=smask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)              # all splits empty: weights 0, output 0
    w = tl.exp2(lse - m)                                  # 0 for empty splits
    o = tl.load(part_o_ptr + (part_row + sp[:, None]) * D + d[None, :],
                mask=smask[:, None] & (d[None, :] < D), other=0.0)
    total = tl.sum(w, axis=0)
    out = tl.sum(o * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4                                              # interpreter: small, so the tests split


MAX_SPLITS = 32
MIN_TOKENS_PER_SPLIT = 64


def decode_num_splits(batch: int, num_kv_heads: int, max_blocks: int, block_size: int, device: torch.device) -> int:
    """How many ways to split each context, from shapes alone (batch, kv heads, block-table width), so the
    value is fixed for a captured CUDA graph: about 4 programs per SM (measured best on an H200 for
    B=1..256, Hk=2..8, contexts 512..16K), none once B * Hk fills 2 waves by itself, and no split
    shorter than MIN_TOKENS_PER_SPLIT (one tile) of table capacity."""
    want = 4 * _num_sms(device) // (batch * num_kv_heads)
    by_capacity = triton.cdiv(max_blocks * block_size, MIN_TOKENS_PER_SPLIT)
    return max(1, min(want, by_capacity, MAX_SPLITS))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           num_splits: int | None = None) -> torch.Tensor:
    """q [B, Hq, D] (one token per sequence), caches [num_blocks, block_size, Hk, D],
    block_tables int32 [B, max_blocks], context_lens int32 [B] -> [B, Hq, D] in q's dtype.

    `num_splits` overrides the shape-derived split count (tests, tuning)."""
    B, Hq, D = q.shape
    num_blocks, block_size, Hk, Dk = k_cache.shape
    assert v_cache.shape == k_cache.shape and Dk == D, (q.shape, k_cache.shape, v_cache.shape)
    assert Hq % Hk == 0, (Hq, Hk)
    assert q.dtype in _FLOATS and k_cache.dtype == v_cache.dtype == q.dtype, (q.dtype, k_cache.dtype, v_cache.dtype)
    assert block_tables.dim() == 2 and block_tables.shape[0] == B and not block_tables.is_floating_point()
    assert context_lens.shape == (B,) and not context_lens.is_floating_point()
    assert D <= 256, D
    if q.stride(-1) != 1:
        q = q.contiguous()
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "cache head_dim must be contiguous"
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()

    out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    group = Hq // Hk
    if num_splits is None:
        num_splits = decode_num_splits(B, Hk, block_tables.shape[1], block_size, q.device)
    BLOCK_D = max(triton.next_power_of_2(D), 16)
    BLOCK_G = max(triton.next_power_of_2(group), 16)     # tl.dot needs >= 16 rows
    BLOCK_N = 64 if BLOCK_D <= 128 else 32                # tokens a tile: K and V tiles of 16 KB (bf16)
    if num_splits > 1:
        part_o = torch.empty((B, Hq, num_splits, D), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((B, Hq, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out                           # unused
    pdl = _pdl(q)
    _paged_decode_kernel[(B, Hk, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens,
        out, part_o, part_lse,
        scale * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        Hq, D,
        GROUP=group, BLOCK_SIZE=block_size, NUM_SPLITS=num_splits,
        BLOCK_G=BLOCK_G, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        USE_PDL=pdl, num_warps=4, num_stages=2, launch_pdl=pdl,
    )
    if num_splits > 1:
        _paged_decode_reduce_kernel[(B, Hq)](
            part_o, part_lse, out,
            out.stride(0), out.stride(1), Hq, D,
            NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=BLOCK_D,
            USE_PDL=pdl, num_warps=4, launch_pdl=pdl,
        )
    return out


# --------------------------------------------------------------------------------------------------
# A decode step's per-row bookkeeping: one kernel before the model, one after sampling
# --------------------------------------------------------------------------------------------------
#
# The engine keeps each sequence's state in device rows (position, last token, output count, block
# table, limits, stop ids) and a step names its rows. Gathering the inputs and checking/advancing
# the state afterwards took ~35 small torch kernels a step (index, compare, where, index_put ...),
# a few microseconds each even inside a CUDA graph: at batch 1 a tenth of a small model's step.
# One program a batch row here. Padding rows all name the scratch row: their writes of its state
# race, which is harmless (its state is never read for a real sequence; its position stays 0).

@triton.jit
def _decode_inputs_kernel(rows_ptr, position_ptr, last_token_ptr, tables_ptr,
                          pos_ptr, slot_ptr, ctx_ptr, tables_out_ptr, token_ptr,
                          stride_t, stride_to, max_blocks, scratch, block_size,
                          BLOCK_T: tl.constexpr, USE_PDL: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    _wait_for_earlier_kernels(USE_PDL)
    r = tl.load(rows_ptr + i)
    pos = tl.load(position_ptr + r)
    valid = r != scratch
    table = tables_ptr + r * stride_t
    block = tl.load(table + pos // block_size).to(tl.int64)
    tl.store(pos_ptr + i, pos)
    tl.store(slot_ptr + i, tl.where(valid, block * block_size + pos % block_size, -1))
    tl.store(ctx_ptr + i, tl.where(valid, pos + 1, 0).to(tl.int32))
    tl.store(token_ptr + i, tl.load(last_token_ptr + r))
    for b0 in range(0, max_blocks, BLOCK_T):
        b = b0 + tl.arange(0, BLOCK_T)
        tl.store(tables_out_ptr + i * stride_to + b, tl.load(table + b, mask=b < max_blocks), mask=b < max_blocks)


def decode_inputs(rows, position, last_token, block_tables, scratch, block_size):
    """See kernels.reference.decode_inputs."""
    B, max_blocks = rows.shape[0], block_tables.shape[1]
    assert rows.dtype == position.dtype == last_token.dtype == torch.int64 and block_tables.dtype == torch.int32
    assert rows.is_contiguous() and position.is_contiguous() and last_token.is_contiguous()
    assert block_tables.stride(-1) == 1
    pos = torch.empty(B, dtype=torch.int64, device=rows.device)
    slots, tokens = torch.empty_like(pos), torch.empty_like(pos)
    ctx = torch.empty(B, dtype=torch.int32, device=rows.device)
    tables = torch.empty((B, max_blocks), dtype=torch.int32, device=rows.device)
    if B:
        pdl = _pdl(rows)
        _decode_inputs_kernel[(B,)](rows, position, last_token, block_tables, pos, slots, ctx, tables, tokens,
                                    block_tables.stride(0), tables.stride(0), max_blocks, scratch, block_size,
                                    BLOCK_T=min(triton.next_power_of_2(max_blocks), 1024), USE_PDL=pdl,
                                    num_warps=1, launch_pdl=pdl)
    return pos, slots, ctx, tables, tokens


_FINISH_NONE = tl.constexpr(reference.FINISH_NONE)
_FINISH_STOP = tl.constexpr(reference.FINISH_STOP)
_FINISH_LENGTH = tl.constexpr(reference.FINISH_LENGTH)


@triton.jit
def _decode_finish_kernel(tokens_ptr, rows_ptr, out_count_ptr, min_tokens_ptr, max_tokens_ptr, stop_ids_ptr,
                          last_token_ptr, position_ptr, out_ptr, stride_tok, stride_stop, stride_out, code_row,
                          num_stop, scratch, BLOCK_S: tl.constexpr, ADVANCE: tl.constexpr,
                          WRITE_TOKEN: tl.constexpr, USE_PDL: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    _wait_for_earlier_kernels(USE_PDL)
    r = tl.load(rows_ptr + i)
    token = tl.load(tokens_ptr + i * stride_tok).to(tl.int64)
    count = tl.load(out_count_ptr + r) + 1
    s = tl.arange(0, BLOCK_S)
    stops = tl.load(stop_ids_ptr + r * stride_stop + s, mask=s < num_stop, other=-1)
    hit = tl.max((stops == token).to(tl.int32), axis=0) > 0
    stop = hit & (count > tl.load(min_tokens_ptr + r))
    code = tl.where(stop, _FINISH_STOP, tl.where(count >= tl.load(max_tokens_ptr + r), _FINISH_LENGTH, _FINISH_NONE))
    tl.store(last_token_ptr + r, token)
    tl.store(out_count_ptr + r, count)
    if ADVANCE:
        tl.store(position_ptr + r, tl.load(position_ptr + r) + (r != scratch).to(tl.int64))
    if WRITE_TOKEN:
        tl.store(out_ptr + i, token)
    tl.store(out_ptr + code_row * stride_out + i, code.to(tl.int64))


def decode_finish(tokens, rows, out_count, min_tokens, max_tokens, stop_ids, last_token, position, scratch, out,
                  advance, write_token):
    """See kernels.reference.decode_finish."""
    B = rows.shape[0]
    for t in (rows, out_count, min_tokens, max_tokens, last_token, position):
        assert t.dtype == torch.int64 and t.is_contiguous(), (t.dtype, t.shape)
    assert stop_ids.dtype == torch.int64 and stop_ids.stride(-1) == 1 and out.dtype == torch.int64
    assert tokens.shape == (B,) and out.shape[1] == B and out.stride(-1) == 1
    if B:
        pdl = _pdl(rows)
        _decode_finish_kernel[(B,)](tokens, rows, out_count, min_tokens, max_tokens, stop_ids, last_token, position,
                                    out, tokens.stride(0), stop_ids.stride(0), out.stride(0), out.shape[0] - 1,
                                    stop_ids.shape[1], scratch, BLOCK_S=triton.next_power_of_2(stop_ids.shape[1]),
                                    ADVANCE=advance, WRITE_TOKEN=write_token, USE_PDL=pdl, num_warps=1,
                                    launch_pdl=pdl)


# --------------------------------------------------------------------------------------------------
# Argmax over a row (greedy sampling): one launch, the last chunk's program combines
# --------------------------------------------------------------------------------------------------
#
# torch's argmax over a 152K-token vocabulary is a reduction kernel with two memsets before it (~10 us
# a decode step on an H200; with this kernel Qwen3-0.6B at c=1 went 0.829 -> 0.821 ms a token in an
# A/B run). Here program (row, chunk) finds its chunk's maximum and first index of it, and the last
# of a row's programs to finish (counted with an atomic on a per-row counter) combines them: the
# smallest index among the chunks that hold the row's maximum. Every program's stores come before
# its count (a CTA barrier, then the count's release); the last one reads them after its acquire,
# from the L2 (.cg: this SM's L1 is not kept coherent with other SMs' stores).

@triton.jit
def _argmax_kernel(x_ptr, part_v_ptr, part_i_ptr, out_ptr, counter_ptr, V, stride_x,
                   BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, USE_PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    _wait_for_earlier_kernels(USE_PDL)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    tl.store(part_v_ptr + row * BLOCK_P + chunk, m)
    tl.store(part_i_ptr + row * BLOCK_P + chunk, tl.min(tl.where(x == m, offs, V), axis=0))
    tl.debug_barrier()
    counter = counter_ptr + row
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == chunks - 1:
        p = tl.arange(0, BLOCK_P)
        pv = tl.load(part_v_ptr + row * BLOCK_P + p, mask=p < chunks, other=float("-inf"), cache_modifier=".cg")
        pi = tl.load(part_i_ptr + row * BLOCK_P + p, mask=p < chunks, other=V, cache_modifier=".cg")
        best = tl.max(pv, axis=0)
        tl.store(out_ptr + row, tl.min(tl.where(pv == best, pi, V), axis=0).to(tl.int64))
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


ARGMAX_CHUNK = 4096
ARGMAX_MAX_ROWS = 1 << 16
_argmax_counters: dict[torch.device, torch.Tensor] = {}


def _row_counters(device: torch.device, rows: int) -> torch.Tensor:
    """The argmax kernel's per-row counters on this device: zeroed once, allocated once (captured
    CUDA graphs keep their address), and left zeroed by every launch."""
    assert rows <= ARGMAX_MAX_ROWS, f"argmax over {rows} rows in one launch; at most {ARGMAX_MAX_ROWS}"
    if device not in _argmax_counters:
        _argmax_counters[device] = torch.zeros(ARGMAX_MAX_ROWS, dtype=torch.int32, device=device)
    return _argmax_counters[device]


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [B, V] (floating; no NaN) -> int64 [B]: the first index of each row's maximum, as torch's."""
    assert x.dim() == 2 and x.dtype in _FLOATS, (x.shape, x.dtype)
    if x.stride(-1) != 1:
        x = x.contiguous()
    B, V = x.shape
    out = torch.empty(B, dtype=torch.int64, device=x.device)
    if B == 0:
        return out
    block = min(ARGMAX_CHUNK, triton.next_power_of_2(V))
    chunks = triton.cdiv(V, block)
    block_p = triton.next_power_of_2(chunks)
    part_v = torch.empty((B, block_p), dtype=torch.float32, device=x.device)
    part_i = torch.empty((B, block_p), dtype=torch.int32, device=x.device)
    pdl = _pdl(x)
    _argmax_kernel[(B, chunks)](x, part_v, part_i, out, _row_counters(x.device, B), V, x.stride(0),
                                BLOCK=block, BLOCK_P=block_p, USE_PDL=pdl, num_warps=8, launch_pdl=pdl)
    return out
