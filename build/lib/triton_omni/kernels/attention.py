"""Triton kernels for attention over the paged KV cache; kernels.attention_reference defines what each computes.

    qk_norm_rope_store       per-head RMSNorm of q and k (optional), rotate-half RoPE (partial rotary
                             allowed) and the scatter of k/v into the paged caches (slot -1 skipped), one launch
    paged_decode_attention   one query token per sequence over its paged context, GQA-grouped and
                             split across programs (flash-decoding) with a fixed number of splits
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from triton_omni.kernels.triton_helpers import FLOATS, use_pdl, wait_for_earlier_kernels


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
    wait_for_earlier_kernels(USE_PDL)
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
    assert k.shape == v.shape == (T, Hk, D) and k.dtype == v.dtype == q.dtype and q.dtype in FLOATS
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
    pdl = use_pdl(q)
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
    wait_for_earlier_kernels(USE_PDL)
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
    wait_for_earlier_kernels(USE_PDL)
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
                           max_context_len: int | None = None, num_splits: int | None = None) -> torch.Tensor:
    """q [B, Hq, D] (one token per sequence), caches [num_blocks, block_size, Hk, D],
    block_tables int32 [B, max_blocks], context_lens int32 [B] -> [B, Hq, D] in q's dtype.

    `max_context_len`, the reference's host bound, is not read: each program reads its sequence's own
    length on the device (a CUDA graph replays the launch with other lengths). `num_splits` overrides
    the shape-derived split count (tests, tuning)."""
    B, Hq, D = q.shape
    num_blocks, block_size, Hk, Dk = k_cache.shape
    assert v_cache.shape == k_cache.shape and Dk == D, (q.shape, k_cache.shape, v_cache.shape)
    assert Hq % Hk == 0, (Hq, Hk)
    assert q.dtype in FLOATS and k_cache.dtype == v_cache.dtype == q.dtype, (q.dtype, k_cache.dtype, v_cache.dtype)
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
    pdl = use_pdl(q)
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
