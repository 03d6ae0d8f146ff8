"""Triton kernels for Gated DeltaNet (Qwen3.5's linear attention); kernels.gated_delta_reference defines
what each computes.

    causal_conv1d_update     a decode step of the depthwise causal conv + silu, shifting each slot's window
    causal_conv1d_prefill    the same conv + silu over packed prompts, in one pass (prefill)
    gated_delta_decode       a decode step of Gated DeltaNet (l2-normed q/k, decay, delta-rule state update,
                             read-out) and its gated RMSNorm, one program per (sequence, value head)
    gated_delta_prefill      Gated DeltaNet over packed prompts (the chunked delta rule): one program per
                             (chunk, value head) for what a chunk gives alone, one per (prompt, value head,
                             value block) for the scan over its chunks
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from triton_omni.kernels.gated_delta_reference import DELTA_CHUNK
from triton_omni.kernels.triton_helpers import fitting_stages, use_pdl, wait_for_earlier_kernels


# --------------------------------------------------------------------------------------------------
# Gated DeltaNet decode (Qwen3.5's linear-attention layers)
# --------------------------------------------------------------------------------------------------
# Both kernels are launched with PDL like the rest of the step: everything they read comes from the
# kernel before them, so they wait first. H200, Qwen3.5-0.8B shape, c=1: 0.866 -> 0.858-0.861 ms a
# token (in-process, three samples each, runs before and after the one without).

@triton.jit
def _conv1d_update_kernel(x_ptr, state_ptr, w_ptr, y_ptr, slot_ptr, C, stride_xb, stride_ss, stride_sc, stride_wc,
                          K: tl.constexpr, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr):
    wait_for_earlier_kernels(USE_PDL)
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
    pdl = use_pdl(x)
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
    wait_for_earlier_kernels(USE_PDL)
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
    """See kernels.gated_delta_reference.gated_delta_decode. Strided head views are fine (unit last stride)."""
    B, Hk, DK = q.shape
    Hv, DV = v.shape[1], v.shape[2]
    assert k.shape == q.shape and z.shape == v.shape and a.shape == b.shape == (B, Hv) and Hv % Hk == 0
    assert state.shape[1:] == (Hv, DK, DV) and state.dtype == torch.float32 and state.stride(-1) == 1
    assert state.stride(-2) == DV and norm_weight.dtype == v.dtype
    assert all(t.stride(-1) == 1 for t in (q, k, v, z, a, b))
    out = torch.empty((B, Hv, DV), dtype=v.dtype, device=v.device)
    if B == 0:
        return out
    pdl = use_pdl(v)
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
# kernels.gated_delta_reference.chunk_gated_delta_rule defines the algorithm. Its torch form packs the chunks into
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
    def of(cls, cu_seqlens: torch.Tensor, num_tokens: int, chunk_size: int = DELTA_CHUNK) -> "GatedDeltaChunks":
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
    """See kernels.gated_delta_reference.gated_delta_prefill (the same inputs, with a GatedDeltaChunks for the
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
    grid = (S, H, BLOCK_V // split)
    args = (wv, wk, e, kg, decay, o, state, slots.contiguous(), chunks.cu, chunks.first, o.stride(0), o.stride(1),
            state.stride(0), state.stride(1), H, DK, DV)
    kwargs = dict(C=C, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, SPLIT_V=split, num_warps=4)
    # each pipeline stage holds a chunk's E, Wk, KG and Wv tiles: 3 stages (Triton's default) need 256 KB
    stages = fitting_stages(_gated_delta_scan_kernel, grid, args, kwargs, q.device)
    _gated_delta_scan_kernel[grid](*args, num_stages=stages, **kwargs)
    return o
