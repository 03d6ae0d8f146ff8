"""Each Triton kernel in kernels/triton_ops.py against its torch reference in kernels/reference.py.

On a machine with CUDA the kernels run for real (fp32, bf16 and fp16); without it they run under the
Triton interpreter on the CPU (fp32 only, small shapes: the interpreter is slow).
"""
from __future__ import annotations

import math
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"                 # before triton is imported anywhere below

triton = pytest.importorskip("triton")

from triton_omni.kernels import reference  # noqa: E402
from triton_omni.kernels import triton_ops as ops  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
# the interpreter trips a numpy deprecation when it runs a loop with loaded bounds; not ours
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
DTYPES = [torch.float32, torch.bfloat16, torch.float16] if CUDA else [torch.float32]
# (atol, rtol) against the reference; low-precision outputs may differ by an ulp after rounding
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
ATTN_TOL = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def _close(out, ref, tol):
    atol, rtol = tol
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _randn(*shape, dtype=torch.float32, gen=None):
    return torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float32).to(dtype)


# ---------------------------------------------------------------------------------------------- norm

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (5, 37), (3, 256), (2, 3, 24), (300, 64)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_rms_norm(dtype, shape, with_residual, zero_centered):
    g = _gen(0)
    D = shape[-1]
    x = _randn(*shape, dtype=dtype, gen=g) * 3
    w = _randn(D, dtype=dtype, gen=g) * (0.1 if zero_centered else 1.0)
    res = _randn(*shape, dtype=dtype, gen=g) if with_residual else None
    eps = 1e-6
    out = ops.rms_norm(x, w, eps, res, zero_centered)
    ref = reference.rms_norm(x, w, eps, res, zero_centered)
    if with_residual:
        _close(out[0], ref[0], TOL[dtype])
        assert torch.equal(out[1], ref[1])               # the residual sum is exact in x's dtype
    else:
        _close(out, ref, TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_heads(dtype):
    """Per-head norm (q_norm/k_norm) on a [T, H, D] view cut out of a fused qkv projection."""
    g = _gen(1)
    T, Hq, Hk, D = 20, 4, 2, 40                          # 80 and 40 rows: several programs a tensor
    qkv = _randn(T, (Hq + 2 * Hk) * D, dtype=dtype, gen=g)
    q, k, _ = qkv.split([Hq * D, Hk * D, Hk * D], dim=-1)
    qh, kh = q.view(T, Hq, D), k.view(T, Hk, D)
    assert not qh.is_contiguous()
    w = _randn(D, dtype=dtype, gen=g)
    for x in (qh, kh):
        _close(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), TOL[dtype])


@pytest.mark.skipif(not CUDA, reason="mixed dtypes: CUDA only")
def test_rms_norm_fp32_weight_bf16_input():
    g = _gen(2)
    x = _randn(7, 96, dtype=torch.bfloat16, gen=g)
    w = _randn(96, gen=g)
    out, ref = ops.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5)
    assert out.dtype == torch.float32
    _close(out, ref, TOL[torch.float32])


def test_rms_norm_detects_wrong_weight():
    """The comparison can fail: a perturbed weight must not pass."""
    g = _gen(3)
    x, w = _randn(4, 32, gen=g), _randn(32, gen=g)
    w2 = w.clone()
    w2[5] += 0.5
    with pytest.raises(AssertionError):
        _close(ops.rms_norm(x, w2, 1e-6), reference.rms_norm(x, w, 1e-6), TOL[torch.float32])


# ------------------------------------------------------------------------------------- rotary tables

def _rope_tables(max_pos: int, rotary_dim: int):
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


# ------------------------------------------------------------------------------------------ silu*mul

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (3, 14), (2, 5, 128), (4, 600)])
def test_silu_and_mul(dtype, shape):
    g = _gen(5)
    x = _randn(*shape, dtype=dtype, gen=g) * 4
    _close(ops.silu_and_mul(x), reference.silu_and_mul(x), TOL[dtype])


@pytest.mark.skipif(not CUDA, reason="large shape: CUDA only")
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_large(dtype):
    x = _randn(37, 2 * 3072 + 2 * 5, dtype=dtype, gen=_gen(6))
    _close(ops.silu_and_mul(x), reference.silu_and_mul(x), TOL[dtype])


# ------------------------------------------------------------------------------------- skinny linear

SKINNY_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K", [(40, 24), (70, 300), (9, 1100), (5, 2100)])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear(dtype, N, K, gated, bias):
    """N and K not multiples of the tiles; K past one tile (1100 with 512-wide tiles, 2100 with 1024)."""
    g = _gen(7)
    x = _randn(1, 2 * K if gated else K, dtype=dtype, gen=g) * 2
    w = (_randn(N, K, gen=g) / math.sqrt(K)).to(dtype)
    b = _randn(N, dtype=dtype, gen=g) if bias else None
    _close(ops.skinny_linear(x, w, b, gated), reference.linear(x, w, b, gated), SKINNY_TOL[dtype])


def test_skinny_linear_reads_a_strided_row_and_detects_a_wrong_weight():
    g = _gen(8)
    qkv = _randn(3 * 32, gen=g)
    x = qkv[None, 32:64:1]                                # a view into a fused projection
    w = _randn(48, 32, gen=g)
    ref = reference.linear(x, w)
    _close(ops.skinny_linear(x, w), ref, SKINNY_TOL[torch.float32])
    w2 = w.clone()
    w2[47, 31] += 1.0                                     # the last row's last column: masks are right
    assert not torch.allclose(ops.skinny_linear(x, w2), ref, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K", [(40, 24), (9, 1100), (5, 2100)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_skinny_norm_linear(dtype, N, K, with_residual, zero_centered):
    """The (residual add +) RMSNorm folded into the matmul: same output and new residual as the norm
    kernel followed by the matmul; K past one tile, so the sum of squares spans several."""
    g = _gen(10)
    x = _randn(1, K, dtype=dtype, gen=g) * 3
    res = _randn(1, K, dtype=dtype, gen=g) if with_residual else None
    nw = _randn(K, dtype=dtype, gen=g) * (0.1 if zero_centered else 1.0)
    w = (_randn(N, K, gen=g) / math.sqrt(K)).to(dtype)
    b = _randn(N, dtype=dtype, gen=g)
    y, s = ops.skinny_norm_linear(x, res, nw, 1e-6, zero_centered, w, b)
    ref_y, ref_s = reference.norm_linear(x, res, nw, 1e-6, zero_centered, w, b)
    _close(y, ref_y, SKINNY_TOL[dtype])
    assert torch.equal(s, ref_s)                          # the residual sum is exact in x's dtype
    if not with_residual:
        assert s is x


@pytest.mark.skipif(not CUDA, reason="decode shapes: CUDA only")
@pytest.mark.parametrize("N,K,gated", [(4096, 1024, False), (1024, 2048, False), (1024, 3072, True),
                                       (24576, 4096, False), (4096, 12288, True), (151936, 1024, False)])
def test_skinny_linear_decode_shapes(N, K, gated):
    g = _gen(9)
    x = _randn(1, 2 * K if gated else K, dtype=torch.bfloat16, gen=g)
    w = (_randn(N, K, gen=g) / math.sqrt(K)).to(torch.bfloat16)
    _close(ops.skinny_linear(x, w, None, gated), reference.linear(x, w, None, gated), SKINNY_TOL[torch.bfloat16])


# ------------------------------------------------------------------------- q/k norm + rotary + store

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,Hq,Hk,D,R", [(1, 4, 2, 16, 16), (5, 8, 2, 40, 24), (3, 3, 1, 64, 64), (4, 16, 8, 128, 128),
                                         (6, 4, 4, 24, 24), (3, 3, 1, 32, 16), (7, 8, 2, 20, 20)])
@pytest.mark.parametrize("norm", [None, "plain", "zero_centered"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_qk_norm_rope_store(dtype, T, Hq, Hk, D, R, norm, block_size):
    """The fused kernel equals norm -> rotary -> store_kv, on strided views of a fused projection whose
    q heads carry a gate after the query (Qwen3.5's layout), with padding slots skipped."""
    g = _gen(11)
    max_pos, num_blocks = 40, 3
    cos, sin = _rope_tables(max_pos, R)
    qkv = _randn(T, (2 * Hq + 2 * Hk) * D, dtype=dtype, gen=g) * 2
    qg, k, v = qkv.split([2 * Hq * D, Hk * D, Hk * D], dim=-1)
    q = qg.view(T, Hq, 2 * D)[..., :D]
    k, v = k.view(T, Hk, D), v.view(T, Hk, D)
    zero_centered = norm == "zero_centered"
    qw = kw = None
    if norm:
        qw = _randn(D, dtype=dtype, gen=g) * (0.1 if zero_centered else 1.0)
        kw = _randn(D, dtype=dtype, gen=g) * (0.1 if zero_centered else 1.0)
    positions = torch.randint(0, max_pos, (T,), generator=g, device=DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=g, device=DEVICE)[:T]
    if T > 1:
        slots[1] = -1
    caches = [_randn(num_blocks, block_size, Hk, D, dtype=dtype, gen=g) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    qkv0 = qkv.clone()
    oq, ok = ops.qk_norm_rope_store(q, k, v, qw, kw, 1e-6, zero_centered, cos, sin, positions, *caches, slots)
    rq, rk = reference.qk_norm_rope_store(q, k, v, qw, kw, 1e-6, zero_centered, cos, sin, positions,
                                          *ref_caches, slots)
    _close(oq, rq, TOL[dtype])
    _close(ok, rk, TOL[dtype])
    _close(caches[0], ref_caches[0], TOL[dtype])
    assert torch.equal(caches[1], ref_caches[1])         # v is copied exactly, padding untouched
    assert torch.equal(qkv, qkv0), "the kernel must not modify its inputs"
    kept = slots >= 0                                    # the cache holds exactly the k it returned
    assert torch.equal(caches[0].view(-1, Hk, D)[slots[kept]], ok[kept])
    if norm is None and R < D:                           # the unrotated tail passes through bit-exactly
        assert torch.equal(oq[..., R:], q[..., R:]) and torch.equal(ok[..., R:], k[..., R:])


# ------------------------------------------------------- Gated DeltaNet (conv, delta rule: prefill, decode)

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens,C,K", [([3, 7], 40, 4), ([2, 19, 1, 33], 300, 4), ([5, 3], 64, 2)])
def test_causal_conv1d_prefill(dtype, lens, C, K):
    """Packed prompts (some shorter than the window): no tap crosses into the prompt before."""
    g = _gen(17)
    T = sum(lens)
    x = _randn(T, C + 9, dtype=dtype, gen=g)[:, :C]                  # a strided slice of a projection
    w = _randn(C, K, dtype=dtype, gen=g)
    positions = torch.cat([torch.arange(n) for n in lens]).to(DEVICE)
    out = ops.causal_conv1d_prefill(x, w, positions)
    _close(out, reference.causal_conv1d_prefill(x, w, positions), TOL[dtype])
    second = slice(lens[0], lens[0] + lens[1])
    alone = ops.causal_conv1d_prefill(x[second], w, torch.arange(lens[1], device=DEVICE))
    assert torch.equal(alone, out[second])                          # the second prompt as if alone


def _delta_prefill(q, k, v, a, b, A_log, dt_bias, lens, state, slots, num_tokens=None):
    cu = torch.tensor([0, *lens], device=DEVICE).cumsum(0).int()
    chunks = ops.GatedDeltaChunks.of(cu, num_tokens or sum(lens))
    return ops.gated_delta_prefill(q, k, v, a, b, A_log, dt_bias, chunks, state, slots)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens,empty,pad,Hk,Hv,DK,DV", [([150, 1, 64, 65, 7], 0, 0, 1, 2, 16, 24),
                                                        ([3], 2, 70, 2, 2, 32, 16),
                                                        ([130, 64], 1, 5, 2, 4, 128, 128)])
def test_gated_delta_prefill(dtype, lens, empty, pad, Hk, Hv, DK, DV):
    """Packed prompts of unequal lengths (chunks cut mid-prompt and at its end, a one-token prompt),
    strided head views as the model passes them. As a prefill graph lays them out: `empty` empty
    prompts after them, whose state slot (the scratch row) stays as it was, and `pad` tokens of no
    prompt at the end. Each prompt's last state lands in its own slot and no other slot changes; a
    prompt alone gives exactly what it gives packed."""
    g = _gen(18)
    total = sum(lens)
    T = total + pad
    mixed = _randn(T, 2 * Hk * DK + Hv * DV + 3, dtype=dtype, gen=g)[:, 3:]        # a strided conv output
    q, k, v = mixed.split([Hk * DK, Hk * DK, Hv * DV], dim=-1)
    q, k, v = q.view(T, Hk, DK), k.view(T, Hk, DK), v.view(T, Hv, DV)
    ab = _randn(T, 2 * Hv, dtype=dtype, gen=g)
    a, b = ab[:, :Hv], ab[:, Hv:]
    A_log, dt_bias = _randn(Hv, dtype=dtype, gen=g) * 0.5, _randn(Hv, dtype=dtype, gen=g)
    n, scratch = len(lens), len(lens) + 2
    state = _randn(scratch + 1, Hv, DK, DV, dtype=torch.float32, gen=g)             # stale slots
    slots = torch.tensor([*reversed(range(n)), *[scratch] * empty], device=DEVICE)
    before = state.clone()
    out = _delta_prefill(q, k, v, a, b, A_log, dt_bias, lens + [0] * empty, state, slots, num_tokens=T)
    layout = reference.ChunkLayout.build(lens, reference.DELTA_CHUNK, DEVICE)
    ref_out, ref_states = reference.gated_delta_prefill(q[:total], k[:total], v[:total], a[:total], b[:total],
                                                        A_log, dt_bias, layout)
    _close(out[:total], ref_out, (2e-5, 1e-4))
    _close(state[slots[:n]], ref_states, (2e-5, 1e-4))
    untouched = [i for i in range(len(state)) if i not in slots[:n].tolist()]
    assert torch.equal(state[untouched], before[untouched])
    first = slice(0, lens[0])
    alone = _delta_prefill(q[first], k[first], v[first], a[first], b[first], A_log, dt_bias, lens[:1], state,
                           torch.tensor([n], device=DEVICE))
    assert torch.equal(alone, out[first]) and torch.equal(state[n], state[slots[0]])


def test_gated_delta_chunk_table_from_cu_seqlens():
    """The chunk table built on the device: chunks numbered prompt by prompt, spare entries past the last
    chunk point past the last prompt (their programs return), empty prompts own no chunk."""
    cu = torch.tensor([0, 64, 65, 65, 200], device=DEVICE, dtype=torch.int32)
    chunks = ops.GatedDeltaChunks.of(cu, num_tokens=230, chunk_size=64)
    assert chunks.first.tolist() == [0, 1, 2, 2, 5]
    assert chunks.seq.tolist() == [0, 1, 3, 3, 3] + [4] * (230 // 64 + 4 - 5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,C,K", [(1, 40, 4), (5, 300, 4), (3, 64, 2)])
def test_causal_conv1d_update(dtype, B, C, K):
    g = _gen(13)
    slots_total = 7
    x = _randn(B, C + 5, dtype=dtype, gen=g)[:, :C]                  # a strided slice of a projection
    state = _randn(slots_total, C, K - 1, dtype=dtype, gen=g)
    w = _randn(C, K, dtype=dtype, gen=g)
    slots = torch.randperm(slots_total, generator=g, device=DEVICE)[:B]
    ref_state = state.clone()
    out = ops.causal_conv1d_update(x, state, w, slots)
    ref = reference.causal_conv1d_update(x, ref_state, w, slots)
    _close(out, ref, TOL[dtype])
    assert torch.equal(state, ref_state)                            # the window shifts exactly


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hk,Hv,DK,DV", [(1, 2, 4, 16, 16), (3, 1, 2, 32, 24), (2, 2, 2, 128, 128)])
def test_gated_delta_decode(dtype, B, Hk, Hv, DK, DV):
    g = _gen(14)
    slots_total = 5
    width = 2 * Hk * DK + Hv * DV
    mixed = _randn(B, width, dtype=dtype, gen=g)
    q, k, v = mixed.split([Hk * DK, Hk * DK, Hv * DV], dim=-1)
    q, k, v = q.view(B, Hk, DK), k.view(B, Hk, DK), v.view(B, Hv, DV)
    proj = _randn(B, Hv * DV + 2 * Hv, dtype=dtype, gen=g)
    z, b, a = proj.split([Hv * DV, Hv, Hv], dim=-1)
    z = z.view(B, Hv, DV)
    A_log, dt_bias = _randn(Hv, dtype=dtype, gen=g) * 0.5, _randn(Hv, dtype=dtype, gen=g)
    norm_w = 1 + 0.1 * _randn(DV, dtype=dtype, gen=g)
    state = _randn(slots_total, Hv, DK, DV, gen=g) * 0.3
    slots = torch.randperm(slots_total, generator=g, device=DEVICE)[:B]
    ref_state = state.clone()
    out = ops.gated_delta_decode(q, k, v, a, b, A_log, dt_bias, state, slots, z, norm_w, 1e-6)
    ref = reference.gated_delta_decode(q, k, v, a, b, A_log, dt_bias, ref_state, slots, z, norm_w, 1e-6)
    _close(out, ref, ATTN_TOL[dtype])
    torch.testing.assert_close(state, ref_state, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------ decode attention

def _decode_case(B, Hq, Hk, D, block_size, context_lens, dtype, seed, extra_table_cols=2):
    """Random caches and block tables (blocks shuffled, tables wider than needed, as a graph buffer)."""
    g = _gen(seed)
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
    q = _randn(B, Hq, D, dtype=dtype, gen=g) * 2         # a peaked softmax shows rescaling errors
    k_cache = _randn(num_blocks, block_size, Hk, D, dtype=dtype, gen=g)
    v_cache = _randn(num_blocks, block_size, Hk, D, dtype=dtype, gen=g)
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
    _close(out, ref, ATTN_TOL[dtype])


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
        _close(out, ref, ATTN_TOL[dtype])


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
        _close(out, ref, ATTN_TOL[dtype])


def test_paged_decode_attention_detects_wrong_scale():
    """The comparison can fail: a wrong softmax scale must not pass."""
    q, k_cache, v_cache, block_tables, lens = _decode_case(2, 4, 2, 32, 16, [20, 9], torch.float32, seed=11)
    ref = reference.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 32 ** -0.5, 20)
    out = ops.paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.5 * 32 ** -0.5)
    with pytest.raises(AssertionError):
        _close(out, ref, ATTN_TOL[torch.float32])


@pytest.mark.skipif(not CUDA, reason="the CUDA path of dispatch.prefill_attention")
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_cuda_path(dtype):
    """dispatch's CUDA prefill attention (4-D, kv heads repeated: the flash kernel where it applies)
    against the reference's grouped-query call, for packed prompts of several lengths."""
    from triton_omni.kernels import dispatch

    lens, hq, hk, d = [37, 1, 200, 64], 16, 4, 128
    g = _gen(11)
    q, k, v = (torch.randn(sum(lens), h, d, device=DEVICE, dtype=dtype, generator=g) for h in (hq, hk, hk))
    _close(dispatch.prefill_attention(q, k, v, lens, d ** -0.5), reference.prefill_attention(q, k, v, lens, d ** -0.5),
           ATTN_TOL[dtype])


@pytest.mark.skipif(not CUDA, reason="the varlen (flash) path of dispatch.prefill_attention")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_attention_varlen_path_with_padding_sequences(dtype):
    """The packed varlen kernel as a prefill graph calls it: prompts, then padding as a sequence of its
    own, then empty sequences, with a loose length bound; the prompts' rows equal the reference's."""
    from triton_omni.kernels import dispatch

    lens, hq, hk, d, bucket = [37, 1, 90], 16, 4, 128, 256
    g = _gen(12)
    q, k, v = (torch.randn(bucket, h, d, device=DEVICE, dtype=dtype, generator=g) for h in (hq, hk, hk))
    cu = torch.tensor([0, 37, 38, 128, bucket, bucket, bucket], device=DEVICE, dtype=torch.int32)
    out = dispatch.prefill_attention(q, k, v, None, d ** -0.5, cu, bucket)
    n = sum(lens)
    _close(out[:n], reference.prefill_attention(q[:n], k[:n], v[:n], lens, d ** -0.5), ATTN_TOL[dtype])


# ------------------------------------------------------------------------ decode step bookkeeping

def _row_state(rows: int, max_blocks: int, seed: int):
    """Random per-row engine state (the last row is the scratch row, at position 0 as the engine keeps it)."""
    g = torch.Generator().manual_seed(seed)
    ri = lambda lo, hi, *shape: torch.randint(lo, hi, shape, generator=g, dtype=torch.int64)  # noqa: E731
    block_size = 4
    state = dict(position=ri(0, max_blocks * block_size, rows), last_token=ri(0, 1000, rows),
                 block_tables=ri(0, 500, rows, max_blocks).int(), out_count=ri(0, 20, rows),
                 min_tokens=ri(0, 4, rows), max_tokens=ri(1, 24, rows), stop_ids=ri(-1, 12, rows, 16))
    state["position"][-1] = 0
    return {k: v.to(DEVICE) for k, v in state.items()}, block_size


def test_decode_inputs():
    """Positions, cache slots, context lengths, block tables and tokens of the named rows; padding
    (the scratch row, several times) gets slot -1 and context 0."""
    state, block_size = _row_state(9, 6, seed=1)
    scratch = 8
    rows = torch.tensor([3, 0, 7, 5, scratch, scratch], device=DEVICE)
    args = (rows, state["position"], state["last_token"], state["block_tables"], scratch, block_size)
    want, got = reference.decode_inputs(*args), ops.decode_inputs(*args)
    for w, o in zip(want, got):
        assert o.dtype == w.dtype and torch.equal(o, w), (o, w)
    assert got[1][-2:].tolist() == [-1, -1] and got[2][-2:].tolist() == [0, 0]
    p = state["position"][3].item()                      # one slot worked by hand
    assert got[1][0].item() == state["block_tables"][3, p // block_size].item() * block_size + p % block_size


@pytest.mark.parametrize("advance,write_token", [(True, True), (False, True), (True, False)])
def test_decode_finish(advance, write_token):
    """Finish codes (stop id after min_tokens, max_tokens, none) and the advanced state of every real
    row equal the reference's; the scratch row's position never moves."""
    state, _ = _row_state(9, 6, seed=2)
    scratch = 8
    rows = torch.tensor([3, 0, 7, 5, 1, scratch, scratch], device=DEVICE)
    tokens = torch.tensor([4, 11, 900, 2, 7, 0, 0], device=DEVICE)
    state["stop_ids"][3, :3] = torch.tensor([-1, 4, -1])          # a stop id hit, past min_tokens
    state["out_count"][3], state["min_tokens"][3], state["max_tokens"][3] = 5, 2, 20
    state["stop_ids"][0, 5] = 11                                  # a hit before min_tokens: no stop
    state["out_count"][0], state["min_tokens"][0], state["max_tokens"][0] = 0, 3, 20
    state["stop_ids"][7] = -1                                     # max_tokens reached
    state["out_count"][7], state["max_tokens"][7] = 9, 10
    results = []
    for impl in (reference.decode_finish, ops.decode_finish):
        s = {k: v.clone() for k, v in state.items()}
        out = torch.full((3, 8), -7, dtype=torch.int64, device=DEVICE)[:, :len(rows)]
        impl(tokens, rows, s["out_count"], s["min_tokens"], s["max_tokens"], s["stop_ids"], s["last_token"],
             s["position"], scratch, out, advance, write_token)
        results.append((s, out))
    (want, want_out), (got, got_out) = results
    assert torch.equal(got_out, want_out), (got_out, want_out)
    assert got_out[-1, :3].tolist() == [reference.FINISH_STOP, reference.FINISH_NONE, reference.FINISH_LENGTH]
    assert got_out[0, :5].tolist() == ([4, 11, 900, 2, 7] if write_token else [-7] * 5)
    real = rows[:5]
    for key in ("out_count", "last_token", "position"):
        assert torch.equal(got[key][real], want[key][real]), key
    assert got["position"][scratch].item() == 0
    moved = (got["position"][real] - state["position"][real]).tolist()
    assert moved == ([1] * 5 if advance else [0] * 5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,V", [(1, 7), (3, 5000), (2, 9000)])
def test_argmax(dtype, B, V):
    """The first index of each row's maximum, as torch's argmax, with the maximum in one chunk, at a
    chunk's edge, repeated across chunks (the first one wins); the counters are left zeroed."""
    x = _randn(B, V, dtype=dtype, gen=_gen(21))
    if V > ops.ARGMAX_CHUNK:
        x[0, ops.ARGMAX_CHUNK - 1] = 50.0                  # last of the first chunk
        x[1, V - 1] = 50.0                                 # the very last
        x[-1, 100] = x[-1, ops.ARGMAX_CHUNK + 3] = 60.0    # a tie across chunks
    out = ops.argmax(x)
    assert out.dtype == torch.int64 and torch.equal(out, x.argmax(-1)), (out, x.argmax(-1))
    if V > ops.ARGMAX_CHUNK:
        assert out[-1].item() == 100
    assert not ops._row_counters(x.device, 1).any()          # the next launch counts from 0 again
