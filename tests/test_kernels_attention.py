"""kernels/attention.py's Triton kernels against their torch references (kernels/attention_reference.py), and
kernels.dispatch.prefill_attention's CUDA paths against the reference.

On a machine with CUDA the kernels run for real (fp32, bf16 and fp16); without it they run under the
Triton interpreter on the CPU (fp32 only, small shapes: the interpreter is slow).
"""
from __future__ import annotations

import math

import pytest
import torch

from tests.kernel_cases import ATTN_TOL, CUDA, DEVICE, DTYPES, INTERPRETER_WARNINGS, TOL, close, generator, randn
from triton_omni.kernels import attention as ops, attention_reference as reference

pytestmark = INTERPRETER_WARNINGS


def _rope_tables(max_pos: int, rotary_dim: int):
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


# ------------------------------------------------------------------------- q/k norm + rotary + store

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,Hq,Hk,D,R", [(1, 4, 2, 16, 16), (5, 8, 2, 40, 24), (3, 3, 1, 64, 64), (4, 16, 8, 128, 128),
                                         (6, 4, 4, 24, 24), (3, 3, 1, 32, 16), (7, 8, 2, 20, 20)])
@pytest.mark.parametrize("norm", [None, "plain", "zero_centered"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_qk_norm_rope_store(dtype, T, Hq, Hk, D, R, norm, block_size):
    """The fused kernel equals norm -> rotary -> store_kv, on strided views of a fused projection whose
    q heads carry a gate after the query (Qwen3.5's layout), with padding slots skipped."""
    g = generator(11)
    max_pos, num_blocks = 40, 3
    cos, sin = _rope_tables(max_pos, R)
    qkv = randn(T, (2 * Hq + 2 * Hk) * D, dtype=dtype, gen=g) * 2
    qg, k, v = qkv.split([2 * Hq * D, Hk * D, Hk * D], dim=-1)
    q = qg.view(T, Hq, 2 * D)[..., :D]
    k, v = k.view(T, Hk, D), v.view(T, Hk, D)
    zero_centered = norm == "zero_centered"
    qw = kw = None
    if norm:
        qw = randn(D, dtype=dtype, gen=g) * (0.1 if zero_centered else 1.0)
        kw = randn(D, dtype=dtype, gen=g) * (0.1 if zero_centered else 1.0)
    positions = torch.randint(0, max_pos, (T,), generator=g, device=DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=g, device=DEVICE)[:T]
    if T > 1:
        slots[1] = -1
    caches = [randn(num_blocks, block_size, Hk, D, dtype=dtype, gen=g) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    qkv0 = qkv.clone()
    oq, ok = ops.qk_norm_rope_store(q, k, v, qw, kw, 1e-6, zero_centered, cos, sin, positions, *caches, slots)
    rq, rk = reference.qk_norm_rope_store(q, k, v, qw, kw, 1e-6, zero_centered, cos, sin, positions,
                                          *ref_caches, slots)
    close(oq, rq, TOL[dtype])
    close(ok, rk, TOL[dtype])
    close(caches[0], ref_caches[0], TOL[dtype])
    assert torch.equal(caches[1], ref_caches[1])         # v is copied exactly, padding untouched
    assert torch.equal(qkv, qkv0), "the kernel must not modify its inputs"
    kept = slots >= 0                                    # the cache holds exactly the k it returned
    assert torch.equal(caches[0].view(-1, Hk, D)[slots[kept]], ok[kept])
    if norm is None and R < D:                           # the unrotated tail passes through bit-exactly
        assert torch.equal(oq[..., R:], q[..., R:]) and torch.equal(ok[..., R:], k[..., R:])


# ------------------------------------------------------------------------------------ decode attention

def _decode_case(B, Hq, Hk, D, block_size, context_lens, dtype, seed, extra_table_cols=2):
    """Random caches and block tables (blocks shuffled, tables wider than needed, as a graph buffer)."""
    g = generator(seed)
    context_lens = torch.tensor(context_lens, dtype=torch.int32, device=DEVICE)
    blocks_needed = [math.ceil(int(n) / block_size) for n in context_lens]
    max_blocks = max(blocks_needed) + extra_table_cols
    num_blocks = sum(blocks_needed) + 3
    perm = torch.randperm(num_blocks, generator=g, device=DEVICE).to(torch.int32)
    block_tables = torch.zeros(B, max_blocks, dtype=torch.int32, device=DEVICE)
    used, start = [], 0
    for b, nb in enumerate(blocks_needed):
        block_tables[b, :nb] = perm[start:start + nb]
        used.append(perm[start:start + nb])
        start += nb
    q = randn(B, Hq, D, dtype=dtype, gen=g) * 2         # a peaked softmax shows rescaling errors
    k_cache = randn(num_blocks, block_size, Hk, D, dtype=dtype, gen=g)
    v_cache = randn(num_blocks, block_size, Hk, D, dtype=dtype, gen=g)
    return q, k_cache, v_cache, block_tables, context_lens


def _poison_unused(k_cache, v_cache, block_tables, context_lens):
    """NaN into every cache row that no sequence's context covers: the kernel must never read them."""
    block_size = k_cache.shape[1]
    live = torch.zeros(k_cache.shape[0] * block_size, dtype=torch.bool, device=k_cache.device)
    for b, n in enumerate(context_lens.tolist()):
        pos = torch.arange(n, device=k_cache.device)
        live[block_tables[b, pos // block_size].long() * block_size + pos % block_size] = True
    k_cache.view(-1, *k_cache.shape[2:])[~live] = float("nan")
    v_cache.view(-1, *v_cache.shape[2:])[~live] = float("nan")


DECODE_CASES = [
    # B, Hq, Hk, D, block_size, context_lens
    (1, 2, 2, 16, 16, [1]),                             # a context of one token, MHA
    (3, 4, 2, 32, 16, [17, 5, 40]),                      # GQA 2, ends mid-block
    (2, 8, 2, 64, 16, [100, 33]),                        # GQA 4, several tiles
    (2, 4, 4, 40, 32, [70, 1]),                          # odd head_dim, block 32
    (2, 6, 2, 24, 32, [65, 31]),                         # group of 3 (padded rows), block 32
    (2, 4, 1, 32, 16, [300, 129]),                       # GQA 4 on one kv head, many tiles per split
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hq,Hk,D,block_size,context_lens", DECODE_CASES)
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_paged_decode_attention(dtype, B, Hq, Hk, D, block_size, context_lens, num_splits):
    q, k_cache, v_cache, block_tables, lens = _decode_case(B, Hq, Hk, D, block_size, context_lens, dtype, seed=8)
    scale = D ** -0.5
    ref = reference.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, scale, max(context_lens))
    _poison_unused(k_cache, v_cache, block_tables, lens)
    out = ops.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, scale, num_splits=num_splits)
    assert torch.isfinite(out.float()).all()
    close(out, ref, ATTN_TOL[dtype])


@pytest.mark.skipif(not CUDA, reason="large shapes: CUDA only")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hq,Hk,D,block_size,context_lens", [
    (4, 32, 8, 128, 16, [1, 300, 2047, 4100]),
    (3, 16, 4, 256, 16, [513, 1, 1500]),
    (2, 16, 2, 96, 32, [777, 64]),
    (64, 32, 8, 128, 16, [1 + 37 * i for i in range(64)]),
])
def test_paged_decode_attention_large(dtype, B, Hq, Hk, D, block_size, context_lens):
    q, k_cache, v_cache, block_tables, lens = _decode_case(B, Hq, Hk, D, block_size, context_lens, dtype, seed=9,
                                                           extra_table_cols=64)
    scale = D ** -0.5
    ref = reference.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, scale, max(context_lens))
    for num_splits in (None, 1, 7, ops.MAX_SPLITS):
        out = ops.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, scale, num_splits=num_splits)
        close(out, ref, ATTN_TOL[dtype])


@pytest.mark.skipif(not CUDA, reason="CUDA graphs: CUDA only")
def test_paged_decode_attention_cuda_graph():
    """Captured once, replayed with other context lengths and tables: the launch takes no host max."""
    dtype = torch.bfloat16
    q, k_cache, v_cache, block_tables, lens = _decode_case(8, 16, 4, 128, 16, [900] * 8, dtype, seed=10)
    scale = 128 ** -0.5
    ops.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, scale)   # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, scale)
    for new_lens in ([1, 2, 3, 4, 5, 6, 7, 8], [900, 17, 512, 33, 1, 640, 899, 256]):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        ref = reference.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, scale, max(new_lens))
        close(out, ref, ATTN_TOL[dtype])


def test_paged_decode_attention_detects_wrong_scale():
    """The comparison can fail: a wrong softmax scale must not pass."""
    q, k_cache, v_cache, block_tables, lens = _decode_case(2, 4, 2, 32, 16, [20, 9], torch.float32, seed=11)
    ref = reference.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 32 ** -0.5, 20)
    out = ops.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.5 * 32 ** -0.5)
    with pytest.raises(AssertionError):
        close(out, ref, ATTN_TOL[torch.float32])


@pytest.mark.skipif(not CUDA, reason="the CUDA path of dispatch.prefill_attention")
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_cuda_path(dtype):
    """dispatch's CUDA prefill attention (4-D, kv heads repeated: the flash kernel where it applies)
    against the reference's grouped-query call, for packed prompts of several lengths."""
    from triton_omni.kernels import dispatch

    lens, hq, hk, d = [37, 1, 200, 64], 16, 4, 128
    g = generator(11)
    q, k, v = (torch.randn(sum(lens), h, d, device=DEVICE, dtype=dtype, generator=g) for h in (hq, hk, hk))
    close(dispatch.prefill_attention(q, k, v, lens, d ** -0.5), reference.prefill_attention(q, k, v, lens, d ** -0.5),
           ATTN_TOL[dtype])


@pytest.mark.skipif(not CUDA, reason="the varlen (flash) path of dispatch.prefill_attention")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_attention_varlen_path_with_padding_sequences(dtype):
    """The packed varlen kernel as a prefill graph calls it: prompts, then padding as a sequence of its
    own, then empty sequences, with a loose length bound; the prompts' rows equal the reference's."""
    from triton_omni.kernels import dispatch

    lens, hq, hk, d, bucket = [37, 1, 90], 16, 4, 128, 256
    g = generator(12)
    q, k, v = (torch.randn(bucket, h, d, device=DEVICE, dtype=dtype, generator=g) for h in (hq, hk, hk))
    cu = torch.tensor([0, 37, 38, 128, bucket, bucket, bucket], device=DEVICE, dtype=torch.int32)
    out = dispatch.prefill_attention(q, k, v, None, d ** -0.5, cu, bucket)
    n = sum(lens)
    close(out[:n], reference.prefill_attention(q[:n], k[:n], v[:n], lens, d ** -0.5), ATTN_TOL[dtype])
