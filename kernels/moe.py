"""Triton kernels for sparse mixture-of-experts blocks; kernels.moe_reference defines what each computes.

    route                    the fused router: softmax over the experts' logits, top k, renormalisation,
                             BLOCK_T tokens a program
    align                    the (token, slot) pairs grouped by expert, each group padded to the row tile
                             of the grouped matmuls, all on the device (one launch, no host sync)
    experts                  the routed experts of every token: align, then the grouped gate/up matmul
                             with silu(gate) * up, the grouped down matmul scaled by the routing weights,
                             and each token's sum over its k pairs
    sparse_moe               a whole block after its router matmul (what models call): for a few tokens
                             (decode) two weight-streaming kernels with the routing, the input's RMSNorm
                             and the shared expert folded in; for more, `route` + `experts`

Nothing here reads a device value on the host: grids and buffers are sized from shapes alone (the
sorted pairs by their bound, moe_reference.padded_pairs; row tiles past the last group exit at once),
so a decode step or a prefill bucket holding these kernels is captured in a CUDA graph.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from triton_omni.kernels import dispatch
from triton_omni.kernels.moe_reference import padded_pairs
from triton_omni.kernels.norms import rms_norm, silu_and_mul
from triton_omni.kernels.triton_helpers import FLOATS, norm_scale, silu_mul, use_pdl, wait_for_earlier_kernels

# Shared memory one block may ask for on Hopper (H100 / H200); a kernel asking for more fails at launch on
# the GPU only (the interpreter never checks). Configs are sized from the device's own limit (below).
HOPPER_SHARED_MEMORY = 232_448
# Up to this many tokens the experts stream their weights once per (token, slot) pair (decode); past it
# the pairs are grouped by expert so that each expert's weights are read once per row tile. Two tokens
# with k = 8 of 128 experts share an expert rarely; at 8 tokens (64 pairs) the grouped matmuls read
# ~25% fewer weights. Not timed yet: perf_analyzer_configs/benchmarks/bench_moe.py times both paths
# around it on the GPU.
GEMV_MAX_TOKENS = 4
# tokens per grouped pass: the pairs' activations and outputs ([T * k, I] and [T * k, H] in the model
# dtype) are kept for one pass at a time (4,096 tokens with k = 8 and H = 2048: 134 MB of outputs)
MAX_PAIRS_PER_PASS = 32_768


@functools.lru_cache(maxsize=None)
def max_shared_memory(device: torch.device) -> int:
    if dispatch.INTERPRETER or device.type != "cuda":
        return HOPPER_SHARED_MEMORY
    return triton.runtime.driver.active.utils.get_device_properties(device.index or 0)["max_shared_mem"]


# --------------------------------------------------------------------------------------------------
# Routing: softmax, top k, renormalisation (fused)
# --------------------------------------------------------------------------------------------------

@triton.jit
def _softmax_topk(x, valid, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [R, BLOCK_E] fp32 logits, valid [BLOCK_E] the real experts -> (weights [R, BLOCK_K] fp32, ids
    [R, BLOCK_K] int32), most probable first, columns from TOP_K on 0. Softmax as torch computes it
    (exp(x - max) / sum), then k rounds of argmax (the lowest index among equal maxima)."""
    x = tl.where(valid[None, :], x, float("-inf"))
    p = tl.exp(x - tl.max(x, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    p = tl.where(valid[None, :], p, -1.0)                 # never picked, even past a row's last expert
    cols = tl.arange(0, x.shape[1])
    slot = tl.arange(0, BLOCK_K)[None, :]
    weights = tl.zeros([x.shape[0], BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([x.shape[0], BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(p, axis=1)
        weights = tl.where(slot == j, tl.max(p, axis=1)[:, None], weights)
        ids = tl.where(slot == j, best[:, None].to(tl.int32), ids)
        p = tl.where(cols[None, :] == best[:, None], -1.0, p)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=1)[:, None]
    return weights, ids


@triton.jit
def _route_kernel(logits_ptr, w_ptr, ids_ptr, T, E, stride_t, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    rmask = rows < T
    x = tl.load(logits_ptr + rows[:, None].to(tl.int64) * stride_t + cols[None, :],
                mask=rmask[:, None] & (cols < E)[None, :], other=0.0).to(tl.float32)
    weights, ids = _softmax_topk(x, cols < E, TOP_K, RENORMALIZE, BLOCK_K)
    slot = tl.arange(0, BLOCK_K)
    out = rows[:, None] * TOP_K + slot[None, :]
    omask = rmask[:, None] & (slot < TOP_K)[None, :]
    tl.store(w_ptr + out, weights, mask=omask)
    tl.store(ids_ptr + out, ids, mask=omask)


def route_config(num_experts: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_E): a [BLOCK_T, BLOCK_E] fp32 tile of ~4K logits a program, in registers."""
    block_e = triton.next_power_of_2(num_experts)
    return max(1, min(64, 4096 // block_e)), block_e


def route_shared_memory(num_experts: int) -> int:
    """Bytes of shared memory the route kernel may ask for: its row reductions stage at most the whole
    fp32 tile once (a bound, not what Triton allocates)."""
    block_t, block_e = route_config(num_experts)
    return block_t * block_e * 4


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] fp32, ids [T, k] int32), as moe_reference.route."""
    T, E = logits.shape
    assert logits.dtype in FLOATS and 1 <= top_k <= E, (logits.dtype, top_k, E)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    weights = torch.empty((T, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((T, top_k), dtype=torch.int32, device=logits.device)
    block_t, block_e = route_config(E)
    if T:
        _route_kernel[(triton.cdiv(T, block_t),)](
            logits, weights, ids, T, E, logits.stride(0), TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_T=block_t,
            BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k), num_warps=4)
    return weights, ids


# --------------------------------------------------------------------------------------------------
# Alignment: pairs grouped by expert, groups padded to the row tile
# --------------------------------------------------------------------------------------------------
#
# Program e counts every expert's pairs (a histogram per chunk of ids), so it knows where its group
# starts (the padded counts of the experts before it), then walks the ids again and writes its own
# pairs in increasing order (a running cumulative sum of the hits), its padding and its row tiles'
# expert. Program 0 also fills what lies past the last group. Each program reads all T * k ids twice:
# a few thousand at decode, 2 x 32K (L2-resident) for a 4K-token pass.

ALIGN_CHUNK = 1024


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, TK, E, P, NUM_BLOCKS,
                  BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    e = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    bins = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, TK, CHUNK):
        live = start + offs < TK
        x = tl.load(ids_ptr + start + offs, mask=live, other=0)
        counts += tl.histogram(x, BLOCK_E, mask=live)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    first = tl.sum(tl.where(bins < e, padded, 0), axis=0)          # where expert e's group starts
    mine = tl.sum(tl.where(bins == e, counts, 0), axis=0)
    my_padded = tl.sum(tl.where(bins == e, padded, 0), axis=0)
    seen = 0
    for start in range(0, TK, CHUNK):
        live = start + offs < TK
        hit = (tl.load(ids_ptr + start + offs, mask=live, other=-1) == e).to(tl.int32)
        tl.store(sorted_ptr + first + seen + tl.cumsum(hit, axis=0) - 1, start + offs, mask=hit > 0)
        seen += tl.sum(hit, axis=0)
    pad = tl.arange(0, BLOCK_M)
    tl.store(sorted_ptr + first + mine + pad, TK, mask=pad < my_padded - mine)
    for b in range(0, my_padded // BLOCK_M, CHUNK):
        tl.store(block_expert_ptr + first // BLOCK_M + b + offs, e, mask=b + offs < my_padded // BLOCK_M)
    if e == 0:
        total = tl.sum(padded, axis=0)
        for start in range(total, P, CHUNK):
            tl.store(sorted_ptr + start + offs, TK, mask=start + offs < P)
        for start in range(total // BLOCK_M, NUM_BLOCKS, CHUNK):
            tl.store(block_expert_ptr + start + offs, -1, mask=start + offs < NUM_BLOCKS)


def align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] -> (sorted_pairs [P] int32, block_expert [P / block_m] int32), as moe_reference.align."""
    ids = ids.contiguous()
    TK = ids.numel()
    P = padded_pairs(TK, num_experts, block_m)
    sorted_pairs = torch.empty((P,), dtype=torch.int32, device=ids.device)
    block_expert = torch.empty((P // block_m,), dtype=torch.int32, device=ids.device)
    if P:
        _align_kernel[(num_experts,)](ids, sorted_pairs, block_expert, TK, num_experts, P, P // block_m,
                                      BLOCK_M=block_m, BLOCK_E=triton.next_power_of_2(num_experts),
                                      CHUNK=ALIGN_CHUNK, num_warps=4)
    return sorted_pairs, block_expert


# --------------------------------------------------------------------------------------------------
# Grouped expert matmuls over the aligned pairs
# --------------------------------------------------------------------------------------------------
#
# Program (b, n): row tile b (BLOCK_M pairs of one expert, padding masked) times that expert's weight
# tile n, on the tensor cores. gate/up: each program holds the gate and the up rows of the same BLOCK_N
# outputs and writes silu(gate) * up (rounded as the unfused linear + silu_and_mul round), at the
# pairs' own rows. down: the pairs' outputs times their routing weights; each token's k rows are then
# summed in a fixed order by a third kernel (no atomics: the same batch gives the same bits).

@dataclass(frozen=True)
class GroupedConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    def shared_memory(self, itemsize: int, weight_tiles: int) -> int:
        """Bytes of shared memory a grouped matmul with this config asks for, bounded from above: the
        software pipeline keeps num_stages copies of the input tile and of the weight tile(s), and the
        epilogue may stage each fp32 accumulator once."""
        tiles = (self.block_m + weight_tiles * self.block_n) * self.block_k * itemsize
        return self.num_stages * tiles + weight_tiles * self.block_m * self.block_n * 4


def grouped_config(num_pairs: int, num_experts: int, dims: tuple[int, int], itemsize: int,
                   shared_memory: int = HOPPER_SHARED_MEMORY) -> GroupedConfig:
    """Tiles from the pairs an expert gets on average (few: short row tiles, so padding costs little;
    many: wide ones), capped at the matmul dims (`dims`: the largest N and K) and shrunk until both
    matmuls (gate/up holds two weight tiles) fit the device's shared memory."""
    per_expert = num_pairs / num_experts
    if per_expert <= 16:
        m, n, k, warps, stages = 16, 64, 128, 4, 4
    elif per_expert <= 64:
        m, n, k, warps, stages = 32, 64, 128, 4, 3
    else:
        m, n, k, warps, stages = 64, 128, 64, 8, 3
    if itemsize == 4:                                     # fp32 tiles: half as deep
        k //= 2
    cap = lambda b, d: min(b, max(16, triton.next_power_of_2(d)))  # noqa: E731 - tl.dot takes >= 16
    config = GroupedConfig(m, cap(n, dims[0]), cap(k, dims[1]), warps, stages)
    while config.shared_memory(itemsize, 2) > shared_memory and config.num_stages > 1:
        config = GroupedConfig(m, config.block_n, config.block_k, warps, config.num_stages - 1)
    return config


@triton.jit
def _grouped_gate_up_kernel(h_ptr, w_ptr, act_ptr, sorted_ptr, block_expert_ptr, TK, H, I,
                            stride_ht, stride_we, stride_wn, TOP_K: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            DOT_PRECISION: tl.constexpr):
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b).to(tl.int64)
    if e >= 0:
        pairs = tl.load(sorted_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M))
        live = pairs < TK
        tokens = (pairs // TOP_K).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < I
        k = tl.arange(0, BLOCK_K)
        a_ptrs = h_ptr + tokens[:, None] * stride_ht + k[None, :]
        g_ptrs = w_ptr + e * stride_we + n[None, :].to(tl.int64) * stride_wn + k[:, None]    # [BLOCK_K, BLOCK_N]
        u_ptrs = g_ptrs + I * stride_wn
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            kmask = k0 + k < H
            a = tl.load(a_ptrs + k0, mask=live[:, None] & kmask[None, :], other=0.0)
            wmask = kmask[:, None] & nmask[None, :]
            acc_g = tl.dot(a, tl.load(g_ptrs + k0, mask=wmask, other=0.0), acc_g, input_precision=DOT_PRECISION)
            acc_u = tl.dot(a, tl.load(u_ptrs + k0, mask=wmask, other=0.0), acc_u, input_precision=DOT_PRECISION)
        dtype = act_ptr.dtype.element_ty
        act = silu_mul(acc_g.to(dtype), acc_u.to(dtype))
        tl.store(act_ptr + pairs[:, None].to(tl.int64) * I + n[None, :], act, mask=live[:, None] & nmask[None, :])


@triton.jit
def _grouped_down_kernel(act_ptr, w_ptr, wts_ptr, out_ptr, sorted_ptr, block_expert_ptr, TK, H, I,
                         stride_we, stride_wn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b).to(tl.int64)
    if e >= 0:
        pairs = tl.load(sorted_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M))
        live = pairs < TK
        rows = pairs.to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < H
        k = tl.arange(0, BLOCK_K)
        a_ptrs = act_ptr + rows[:, None] * I + k[None, :]
        w_ptrs = w_ptr + e * stride_we + n[None, :].to(tl.int64) * stride_wn + k[:, None]     # [BLOCK_K, BLOCK_N]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            kmask = k0 + k < I
            a = tl.load(a_ptrs + k0, mask=live[:, None] & kmask[None, :], other=0.0)
            acc = tl.dot(a, tl.load(w_ptrs + k0, mask=kmask[:, None] & nmask[None, :], other=0.0), acc,
                         input_precision=DOT_PRECISION)
        acc = acc * tl.load(wts_ptr + rows, mask=live, other=0.0)[:, None]
        tl.store(out_ptr + rows[:, None] * H + n[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=live[:, None] & nmask[None, :])


@triton.jit
def _sum_pairs_kernel(pair_ptr, out_ptr, sg_ptr, shared_ptr, H, stride_sg, TOP_K: tl.constexpr,
                      HAS_SHARED: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = sum over its k pair rows, in slot order (+ sigmoid(gate) * the shared expert's output)."""
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = n < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(pair_ptr + (t * TOP_K + j) * H + n, mask=mask, other=0.0).to(tl.float32)
    if HAS_SHARED:
        gate = tl.load(sg_ptr + t * stride_sg).to(tl.float32)
        acc += tl.sigmoid(gate) * tl.load(shared_ptr + t * H + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + n, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"   # fp32 exactly as the reference (no TF32)


def experts(h: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
            ids: torch.Tensor, shared=None) -> torch.Tensor:
    """The routed experts' weighted sum [T, H] (moe_reference.experts), grouped by expert; `shared` =
    (gate [T, 1], shared expert output [T, H]) adds sigmoid(gate) * output in the same pass."""
    T, H = h.shape
    E, I2, _ = gate_up.shape
    I, top_k = I2 // 2, ids.shape[1]
    assert h.dtype in FLOATS and gate_up.dtype == down.dtype == h.dtype and down.shape == (E, H, I)
    h, gate_up, down = h.contiguous(), gate_up.contiguous(), down.contiguous()
    out = torch.empty_like(h)
    if T == 0:
        return out
    config = grouped_config(T * top_k, E, (max(I, H), max(I, H)), h.element_size(), max_shared_memory(h.device))
    sorted_pairs, block_expert = align(ids, E, config.block_m)
    blocks = block_expert.numel()
    precision = _dot_precision(h.dtype)
    act = torch.empty((T * top_k, I), dtype=h.dtype, device=h.device)
    common = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, DOT_PRECISION=precision,
                  num_warps=config.num_warps, num_stages=config.num_stages)
    _grouped_gate_up_kernel[(blocks, triton.cdiv(I, config.block_n))](
        h, gate_up, act, sorted_pairs, block_expert, T * top_k, H, I, h.stride(0), gate_up.stride(0),
        gate_up.stride(1), TOP_K=top_k, **common)
    pair_out = torch.empty((T * top_k, H), dtype=h.dtype, device=h.device)
    _grouped_down_kernel[(blocks, triton.cdiv(H, config.block_n))](
        act, down, weights.contiguous(), pair_out, sorted_pairs, block_expert, T * top_k, H, I,
        down.stride(0), down.stride(1), **common)
    gate, shared_out = shared if shared is not None else (h, h)
    block_h = min(1024, triton.next_power_of_2(H))
    _sum_pairs_kernel[(T, triton.cdiv(H, block_h))](
        pair_out, out, gate, shared_out.contiguous(), H, gate.stride(0), TOP_K=top_k, HAS_SHARED=shared is not None,
        BLOCK_H=block_h, num_warps=4)
    return out


# --------------------------------------------------------------------------------------------------
# Decode: weights streamed per (token, slot) pair, routing and norm folded in
# --------------------------------------------------------------------------------------------------
#
# At a few tokens a grouped matmul would be a handful of long programs; here, as in the dense decode
# matmuls (kernels/decode_matmul.py), many short programs each stream a few whole weight rows, every
# load of a program issued at once (one loop trip at the real shapes: a loop of dependent loads would
# wait a memory latency a trip, and nothing pipelines loads that feed no tl.dot).
# gate/up, program (pair p = t * k + slot, n): recomputes token t's routing from its logits (E numbers:
# nothing next to the weights it reads; program n = 0 writes the ids and weights for the down kernel),
# forms the input's RMSNorm on the fly when given the pre-norm hidden state (as skinny_norm_linear
# does), and writes silu(gate) * up for BLOCK_N rows. down, program (t, n): BLOCK_N output rows of all
# the token's k experts at once (a [k, BLOCK_N, I] tile), plus the shared expert, gated, when there is
# one. The routing and the norm then cost no launch of their own, so a decode step's MoE block is the
# router matmul (norm folded) and these two kernels.

# weights one decode program loads at a time (8K: 64 a thread in 4 warps, as the skinny matmuls at K = 2048),
# and the most inputs one loop trip covers
GEMV_TILE = 8192
GEMV_MAX_DEPTH = 2048


@triton.jit
def _gemv_gate_up_kernel(x_ptr, nw_ptr, logits_ptr, w_ptr, act_ptr, ids_ptr, wts_ptr, H, I, E, eps,
                         stride_xt, stride_lt, stride_we, stride_wn,
                         TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, NORM: tl.constexpr,
                         ZERO_CENTERED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_TOPK: tl.constexpr, USE_PDL: tl.constexpr):
    wait_for_earlier_kernels(USE_PDL)
    p = tl.program_id(0)
    pid_n = tl.program_id(1)
    t = (p // TOP_K).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + t * stride_lt + tl.arange(0, 1)[:, None] * 0 + cols[None, :],
                     mask=(cols < E)[None, :], other=0.0).to(tl.float32)
    weights, ids = _softmax_topk(logits, cols < E, TOP_K, RENORMALIZE, BLOCK_TOPK)
    mine = tl.arange(0, BLOCK_TOPK)[None, :] == p % TOP_K
    e = tl.sum(tl.sum(tl.where(mine, ids, 0), axis=1), axis=0)
    if pid_n == 0:
        tl.store(ids_ptr + p, e)
        tl.store(wts_ptr + p, tl.sum(tl.sum(tl.where(mine, weights, 0.0), axis=1), axis=0))
    x_row = x_ptr + t * stride_xt
    k = tl.arange(0, BLOCK_K)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < I
    g_rows = w_ptr + e.to(tl.int64) * stride_we + n[:, None].to(tl.int64) * stride_wn
    u_rows = g_rows + I * stride_wn
    # the first weight tile (at the real shapes all of it) is in flight while the norm reads the row
    wmask = nmask[:, None] & (k < H)[None, :]
    g = tl.load(g_rows + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
    u = tl.load(u_rows + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
    rstd = 1.0
    if NORM:
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            xk = tl.load(x_row + k0 + k, mask=k0 + k < H, other=0.0).to(tl.float32)
            squares += xk * xk
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / H + eps)
    part_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    part_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        kmask = k0 + k < H
        if k0 > 0:
            wmask = nmask[:, None] & kmask[None, :]
            g = tl.load(g_rows + k0 + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
            u = tl.load(u_rows + k0 + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
        xk = tl.load(x_row + k0 + k, mask=kmask, other=0.0)
        if NORM:       # rounded as rms_norm rounds its output
            nw = tl.load(nw_ptr + k0 + k, mask=kmask, other=0.0).to(tl.float32)
            xk = norm_scale(xk.to(tl.float32) * rstd, nw, xk.dtype, ZERO_CENTERED).to(xk.dtype)
        xf = xk.to(tl.float32)[None, :]
        part_g += g.to(tl.float32) * xf
        part_u += u.to(tl.float32) * xf
    dtype = act_ptr.dtype.element_ty
    act = silu_mul(tl.sum(part_g, axis=1).to(dtype), tl.sum(part_u, axis=1).to(dtype))
    tl.store(act_ptr + p.to(tl.int64) * I + n, act, mask=nmask)


@triton.jit
def _gemv_down_kernel(act_ptr, ids_ptr, wts_ptr, w_ptr, out_ptr, sg_ptr, sgu_ptr, sw_ptr, H, I, IS,
                      stride_we, stride_wn, stride_sg, stride_sgu, stride_swn,
                      TOP_K: tl.constexpr, BLOCK_TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_KS: tl.constexpr, USE_PDL: tl.constexpr):
    wait_for_earlier_kernels(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < H
    slot = tl.arange(0, BLOCK_TOPK)
    smask = slot < TOP_K
    pairs = t * TOP_K + slot
    experts = tl.load(ids_ptr + pairs, mask=smask, other=0).to(tl.int64)
    weights = tl.load(wts_ptr + pairs, mask=smask, other=0.0)
    rows = w_ptr + experts[:, None, None] * stride_we + n[None, :, None].to(tl.int64) * stride_wn   # [k, BLOCK_N, 1]
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        kmask = k0 + k < I
        w = tl.load(rows + k0 + k[None, None, :], mask=smask[:, None, None] & nmask[None, :, None] & kmask[None, None, :],
                    other=0.0, eviction_policy="evict_first")
        a = tl.load(act_ptr + pairs[:, None] * I + k0 + k[None, :], mask=smask[:, None] & kmask[None, :], other=0.0)
        a = a.to(tl.float32) * weights[:, None]                      # each pair's activation times its weight
        acc += tl.sum(tl.sum(w.to(tl.float32) * a[:, None, :], axis=2), axis=0)
    if HAS_SHARED:
        ks = tl.arange(0, BLOCK_KS)
        rows = sw_ptr + n[:, None].to(tl.int64) * stride_swn
        part = tl.zeros([BLOCK_N, BLOCK_KS], dtype=tl.float32)
        for k0 in range(0, IS, BLOCK_KS):
            kmask = k0 + ks < IS
            w = tl.load(rows + k0 + ks[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0,
                        eviction_policy="evict_first")
            gate = tl.load(sgu_ptr + t * stride_sgu + k0 + ks, mask=kmask, other=0.0)
            a = silu_mul(gate, tl.load(sgu_ptr + t * stride_sgu + IS + k0 + ks, mask=kmask, other=0.0))
            part += w.to(tl.float32) * a.to(tl.float32)[None, :]
        acc += tl.sigmoid(tl.load(sg_ptr + t * stride_sg).to(tl.float32)) * tl.sum(part, axis=1)
    tl.store(out_ptr + t * H + n, acc.to(out_ptr.dtype.element_ty), mask=nmask)


def gemv_config(rows: int, depth: int, slots: int = 1) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) of a decode expert matmul over `depth` inputs, whose programs each load
    `slots` weight rows per output row (2 for gate/up, k for down): the whole depth in one tile up to
    2048, and as many rows as keep the tile at GEMV_TILE weights (at least 1, at most 8 or `rows`).
    Qwen3-30B-A3B at one token: gate/up 2 rows (x gate and up) x 2048 a program, 3,072 programs; down
    8 experts x 1 row x 1024 (768 used), 2,048 programs."""
    block_k = min(GEMV_MAX_DEPTH, max(16, triton.next_power_of_2(depth)))
    block_n = max(1, min(8, triton.next_power_of_2(rows), GEMV_TILE // (slots * block_k)))
    return block_n, block_k


def _gemv_moe(x, logits, gate_up, down, top_k, renormalize, norm, shared):
    T, H = x.shape
    E, I2, _ = gate_up.shape
    I = I2 // 2
    pdl = use_pdl(x)
    act = torch.empty((T * top_k, I), dtype=x.dtype, device=x.device)
    ids = torch.empty((T, top_k), dtype=torch.int32, device=x.device)
    weights = torch.empty((T, top_k), dtype=torch.float32, device=x.device)
    norm_weight, eps, zero_centered = norm if norm is not None else (x, 0.0, False)
    block_n, block_k = gemv_config(I, H, 2)
    _gemv_gate_up_kernel[(T * top_k, triton.cdiv(I, block_n))](
        x, norm_weight, logits, gate_up, act, ids, weights, H, I, E, eps, x.stride(0), logits.stride(0),
        gate_up.stride(0), gate_up.stride(1), TOP_K=top_k, RENORMALIZE=renormalize, NORM=norm is not None,
        ZERO_CENTERED=zero_centered, BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_E=triton.next_power_of_2(E),
        BLOCK_TOPK=triton.next_power_of_2(top_k), USE_PDL=pdl, num_warps=4, launch_pdl=pdl)
    out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    gate, shared_gate_up, shared_down = shared if shared is not None else (x, x, down[0])
    IS = shared_down.shape[1]
    block_topk = triton.next_power_of_2(top_k)
    block_n, block_k = gemv_config(H, min(I, GEMV_MAX_DEPTH // 2), block_topk)
    _gemv_down_kernel[(T, triton.cdiv(H, block_n))](
        act, ids, weights, down, out, gate, shared_gate_up, shared_down, H, I, IS, down.stride(0), down.stride(1),
        gate.stride(0), shared_gate_up.stride(0), shared_down.stride(0), TOP_K=top_k, BLOCK_TOPK=block_topk,
        HAS_SHARED=shared is not None, BLOCK_N=block_n, BLOCK_K=block_k,
        BLOCK_KS=min(GEMV_MAX_DEPTH // 2, max(16, triton.next_power_of_2(IS))), USE_PDL=pdl, num_warps=4, launch_pdl=pdl)
    return out


# --------------------------------------------------------------------------------------------------
# The block
# --------------------------------------------------------------------------------------------------

def sparse_moe(x: torch.Tensor, logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int,
               renormalize: bool, norm=None, shared=None) -> torch.Tensor:
    """moe_reference.sparse_moe on the GPU: x [T, H] (the pre-norm hidden state when `norm` =
    (weight, eps, zero_centered) is given), router logits [T, E] (a view of a wider projection is
    fine), `shared` = (gate [T, 1], gate_up [T, 2Is], down [H, Is]) or None."""
    T, H = x.shape
    E, I2, _ = gate_up.shape
    assert x.dtype in FLOATS and gate_up.dtype == down.dtype == x.dtype, (x.dtype, gate_up.dtype, down.dtype)
    assert logits.shape == (T, E) and down.shape == (E, H, I2 // 2) and 1 <= top_k <= E, (logits.shape, down.shape)
    x, gate_up, down = _rows(x), gate_up.contiguous(), down.contiguous()
    logits = _rows(logits)
    if shared is not None:
        gate, shared_gate_up, shared_down = _rows(shared[0]), _rows(shared[1]), shared[2].contiguous()
        shared = (gate, shared_gate_up, shared_down)
    if T <= GEMV_MAX_TOKENS:
        return _gemv_moe(x, logits, gate_up, down, top_k, renormalize, norm, shared)
    h = x if norm is None else rms_norm(x, norm[0], norm[1], None, norm[2])
    step = max(1, MAX_PAIRS_PER_PASS // top_k)
    passes = []
    for start in range(0, T, step):
        rows = slice(start, start + step)
        weights, ids = route(logits[rows], top_k, renormalize)
        extra = None
        if shared is not None:        # its down matmul on cuBLAS, its gate applied while the pairs are summed
            extra = (shared[0][rows], F.linear(silu_and_mul(shared[1][rows]), shared[2]))
        passes.append(experts(h[rows], gate_up, down, weights, ids, extra))
    return passes[0] if len(passes) == 1 else torch.cat(passes)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A [T, D] operand the kernels index as t_ptr + row * stride(0) + col: unit last stride."""
    return t if t.stride(-1) == 1 else t.contiguous()
