"""Triton kernels for the decode engine's per-row bookkeeping on the device; ar.bookkeeping_reference
defines what each computes.

    decode_inputs            a decode step's inputs gathered from the engine's per-row state
    decode_finish            after sampling: stop check, finish codes, per-row state advanced
    argmax                   the first index of each row's maximum (greedy sampling over the vocabulary)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_omni.ar import bookkeeping_reference as reference
from triton_omni.kernels.triton_helpers import FLOATS, use_pdl, wait_for_earlier_kernels


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
    wait_for_earlier_kernels(USE_PDL)
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
    """See ar.bookkeeping_reference.decode_inputs."""
    B, max_blocks = rows.shape[0], block_tables.shape[1]
    assert rows.dtype == position.dtype == last_token.dtype == torch.int64 and block_tables.dtype == torch.int32
    assert rows.is_contiguous() and position.is_contiguous() and last_token.is_contiguous()
    assert block_tables.stride(-1) == 1
    pos = torch.empty(B, dtype=torch.int64, device=rows.device)
    slots, tokens = torch.empty_like(pos), torch.empty_like(pos)
    ctx = torch.empty(B, dtype=torch.int32, device=rows.device)
    tables = torch.empty((B, max_blocks), dtype=torch.int32, device=rows.device)
    if B:
        pdl = use_pdl(rows)
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
    wait_for_earlier_kernels(USE_PDL)
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
    """See ar.bookkeeping_reference.decode_finish."""
    B = rows.shape[0]
    for t in (rows, out_count, min_tokens, max_tokens, last_token, position):
        assert t.dtype == torch.int64 and t.is_contiguous(), (t.dtype, t.shape)
    assert stop_ids.dtype == torch.int64 and stop_ids.stride(-1) == 1 and out.dtype == torch.int64
    assert tokens.shape == (B,) and out.shape[1] == B and out.stride(-1) == 1
    if B:
        pdl = use_pdl(rows)
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
    wait_for_earlier_kernels(USE_PDL)
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
    assert x.dim() == 2 and x.dtype in FLOATS, (x.shape, x.dtype)
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
    pdl = use_pdl(x)
    _argmax_kernel[(B, chunks)](x, part_v, part_i, out, _row_counters(x.device, B), V, x.stride(0),
                                BLOCK=block, BLOCK_P=block_p, USE_PDL=pdl, num_warps=8, launch_pdl=pdl)
    return out
