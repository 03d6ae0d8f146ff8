"""kernels/moe.py's Triton kernels against their torch references (kernels/moe_reference.py).

On a machine with CUDA the kernels run for real (fp32, bf16 and fp16); without it they run under the
Triton interpreter on the CPU (fp32 only, small shapes: the interpreter is slow). Routing is random,
skewed towards a few experts (uneven loads) and leaves some experts without a token.
"""
from __future__ import annotations

import math

import pytest
import torch

from tests.kernel_cases import CUDA, DEVICE, DTYPES, INTERPRETER_WARNINGS, close, generator, randn
from triton_omni.kernels import moe as ops, moe_reference as reference

pytestmark = INTERPRETER_WARNINGS

MOE_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2), torch.float16: (3e-3, 3e-3)}


def skewed_logits(T: int, E: int, gen, hot: int = 2, cold: int = 2) -> torch.Tensor:
    """Router logits that send most tokens to the first `hot` experts and none to the last `cold`."""
    logits = randn(T, E, gen=gen)
    logits[:, :hot] += 3.0
    logits[:, E - cold:] = -1e4
    return logits


@pytest.mark.parametrize("T,E,k", [(1, 4, 1), (5, 6, 2), (70, 16, 4), (3, 128, 8)])
@pytest.mark.parametrize("renormalize", [False, True])
def test_route(T, E, k, renormalize):
    """Softmax, top k, renormalisation: weights and ids as torch's softmax + topk, most probable first."""
    logits = randn(T, E + 3, gen=generator(1))[:, :E]                 # a view of a wider projection
    weights, ids = ops.route(logits, k, renormalize)
    ref_w, ref_ids = reference.route(logits, k, renormalize)
    assert torch.equal(ids, ref_ids)
    close(weights, ref_w, (1e-6, 1e-5))
    if renormalize:
        close(weights.sum(-1), torch.ones(T, device=DEVICE), (1e-6, 1e-6))


@pytest.mark.parametrize("case", ["uniform", "skewed", "one_token", "one_expert"])
@pytest.mark.parametrize("block_m", [16, 64])
def test_align(case, block_m, monkeypatch):
    """The pairs grouped by expert, in order, padded to block_m, exactly as the reference; ids read in
    chunks of 64 (several chunks, one partial) where the kernel reads 1,024."""
    monkeypatch.setattr(ops, "ALIGN_CHUNK", 64)
    g = generator(2)
    E, T, k = 8, {"one_token": 1}.get(case, 45), 3
    if case == "uniform":
        ids = torch.randint(0, E, (T, k), generator=g, device=DEVICE)
    elif case == "skewed":
        ids = reference.route(skewed_logits(T, E, g), k, False)[1]
    elif case == "one_token":
        ids = torch.tensor([[5, 0, 2]], device=DEVICE)
    else:                                                               # every pair on one expert
        ids = torch.full((T, k), 6, device=DEVICE)
    ids = ids.to(torch.int32)
    sorted_pairs, block_expert = ops.align(ids, E, block_m)
    ref_pairs, ref_blocks = reference.align(ids, E, block_m)
    assert torch.equal(sorted_pairs, ref_pairs) and torch.equal(block_expert, ref_blocks)
    used = block_expert >= 0
    # each expert's group holds its pairs once; the padding and the unused tail hold the sentinel
    live = sorted_pairs[sorted_pairs < T * k]
    assert sorted(live.tolist()) == list(range(T * k))
    assert bool((block_expert[used].diff() >= 0).all())        # groups in expert order
    assert not bool((sorted_pairs.view(-1, block_m)[~used] < T * k).any())


def expert_weights(E: int, H: int, I: int, dtype, gen):
    gate_up = (randn(E, 2 * I, H, gen=gen) / math.sqrt(H)).to(dtype)
    down = (randn(E, H, I, gen=gen) / math.sqrt(I)).to(dtype)
    return gate_up, down


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,E,k,H,I", [(9, 8, 2, 48, 24), (40, 6, 3, 32, 40)])
@pytest.mark.parametrize("with_shared", [False, True])
def test_experts_grouped(dtype, T, E, k, H, I, with_shared):
    """Grouped gate/up and down matmuls over the aligned pairs, summed per token: skewed routing with
    empty experts; H and I not multiples of the tiles."""
    g = generator(3)
    h = randn(T, H, dtype=dtype, gen=g)
    gate_up, down = expert_weights(E, H, I, dtype, g)
    weights, ids = reference.route(skewed_logits(T, E, g), k, True)
    assert 0 < int(torch.bincount(ids.flatten().long(), minlength=E).count_nonzero()) < E
    shared = (randn(T, 1, gen=g).to(dtype), randn(T, H, dtype=dtype, gen=g)) if with_shared else None
    out = ops.experts(h, gate_up, down, weights, ids, shared)
    ref = reference.expert_down(reference.expert_gate_up(h, gate_up, ids), down, weights, ids)
    if with_shared:
        ref = ref + torch.sigmoid(shared[0].float()) * shared[1].float()
    close(out, ref.to(dtype), MOE_TOL[dtype])


def moe_case(T, E, k, H, I, IS, dtype, seed):
    g = generator(seed)
    x = randn(T, H, dtype=dtype, gen=g) * 2
    gate_up, down = expert_weights(E, H, I, dtype, g)
    width = E + (1 + 2 * IS if IS else 0)
    projected = randn(T, width, dtype=dtype, gen=g)                 # the router's merged projection
    projected[:, :E] = skewed_logits(T, E, g).to(dtype)
    shared = None
    if IS:
        shared = (projected[:, E:E + 1], projected[:, E + 1:], (randn(H, IS, gen=g) / math.sqrt(IS)).to(dtype))
    norm_weight = randn(H, dtype=dtype, gen=g) * 0.2 + 1
    return x, projected[:, :E], gate_up, down, shared, norm_weight


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 2, 11])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("IS", [0, 24])
def test_sparse_moe(dtype, T, norm, IS):
    """The whole block: 1 and 2 tokens take the decode kernels (routing, norm and shared expert folded
    in), 11 the grouped path; both against the reference."""
    E, k, H, I = 8, 2, 48, 24
    x, logits, gate_up, down, shared, nw = moe_case(T, E, k, H, I, IS, dtype, seed=4 + T)
    norm = (nw, 1e-6, False) if norm else None
    out = ops.sparse_moe(x, logits, gate_up, down, k, True, norm, shared)
    close(out, reference.sparse_moe(x, logits, gate_up, down, k, True, norm, shared), MOE_TOL[dtype])


def test_sparse_moe_decode_zero_centered_norm_no_renormalisation():
    """The decode kernels' folded norm with the zero-centred scale (Qwen3.5), top k not renormalised
    (Qwen3-MoE without norm_topk_prob), a token a row of a strided batch."""
    x, logits, gate_up, down, shared, nw = moe_case(2, 6, 3, 40, 16, 0, torch.float32, seed=9)
    norm = (nw - 1, 1e-5, True)
    out = ops.sparse_moe(x, logits, gate_up, down, 3, False, norm, None)
    close(out, reference.sparse_moe(x, logits, gate_up, down, 3, False, norm, None), MOE_TOL[torch.float32])


def test_sparse_moe_decode_loops_over_the_depth(monkeypatch):
    """The decode kernels where a row is deeper than one loop trip (at the real shapes one trip covers
    it): gate/up over H = 48 in trips of 32, down over I = 40 and the shared expert's 24 in trips of 16."""
    monkeypatch.setattr(ops, "GEMV_MAX_DEPTH", 32)
    x, logits, gate_up, down, shared, nw = moe_case(1, 8, 2, 48, 40, 24, torch.float32, seed=13)
    norm = (nw, 1e-6, False)
    out = ops.sparse_moe(x, logits, gate_up, down, 2, True, norm, shared)
    close(out, reference.sparse_moe(x, logits, gate_up, down, 2, True, norm, shared), MOE_TOL[torch.float32])


def test_sparse_moe_in_passes_equals_one_pass(monkeypatch):
    """A long prefill is cut into passes of MAX_PAIRS_PER_PASS pairs: the same result as one pass."""
    x, logits, gate_up, down, shared, _ = moe_case(13, 8, 2, 32, 16, 16, torch.float32, seed=10)
    whole = ops.sparse_moe(x, logits, gate_up, down, 2, True, None, shared)
    monkeypatch.setattr(ops, "MAX_PAIRS_PER_PASS", 10)                  # 5 tokens a pass: 3 passes
    torch.testing.assert_close(ops.sparse_moe(x, logits, gate_up, down, 2, True, None, shared), whole,
                               atol=1e-6, rtol=1e-6)


def test_sparse_moe_detects_a_wrong_expert_weight():
    """The comparison can fail: one routed expert's weight changed must change the output."""
    x, logits, gate_up, down, shared, _ = moe_case(3, 8, 2, 32, 16, 0, torch.float32, seed=11)
    ref = reference.sparse_moe(x, logits, gate_up, down, 2, True)
    hit = int(reference.route(logits, 2, True)[1][1, 0])
    bad = down.clone()
    bad[hit, 5, 3] += 1.0
    for path in ("decode", "grouped"):
        out = ops.sparse_moe(x.repeat(4, 1) if path == "grouped" else x, logits.repeat(4, 1) if path == "grouped"
                             else logits, gate_up, bad, 2, True)
        assert not torch.allclose(out[:3], ref, atol=1e-3), path


# (E, k, H, I): Qwen3-30B-A3B (and Qwen3-Omni-30B-A3B's thinker), Qwen3.5-35B-A3B, Qwen3.5-397B-A17B,
# Qwen3-Omni's talker
REAL_SHAPES = [(128, 8, 2048, 768), (256, 8, 2048, 512), (512, 10, 4096, 1024), (128, 6, 1024, 384)]


@pytest.mark.parametrize("E,k,H,I", REAL_SHAPES)
def test_configs_fit_hoppers_shared_memory(E, k, H, I):
    """Every config the kernels pick for the real shapes, from one token to a full prefill pass, asks
    for at most the 232,448 bytes of shared memory a Hopper block may have (more fails at launch on
    the GPU only; the interpreter never checks)."""
    assert ops.route_shared_memory(E) <= ops.HOPPER_SHARED_MEMORY
    for tokens in (1, 4, 8, 64, 512, ops.MAX_PAIRS_PER_PASS // k):
        for itemsize in (2, 4):
            config = ops.grouped_config(tokens * k, E, (max(H, I), max(H, I)), itemsize)
            assert config.num_stages >= 2, config
            assert config.shared_memory(itemsize, weight_tiles=2) <= ops.HOPPER_SHARED_MEMORY, (tokens, config)


@pytest.mark.skipif(not CUDA, reason="real shapes: CUDA only")
@pytest.mark.parametrize("E,k,H,I", REAL_SHAPES[:2])
@pytest.mark.parametrize("T", [1, 4, 64, 600])
def test_sparse_moe_real_shapes(E, k, H, I, T):
    x, logits, gate_up, down, shared, nw = moe_case(T, E, k, H, I, I, torch.bfloat16, seed=12)
    norm = (nw, 1e-6, True)
    out = ops.sparse_moe(x, logits, gate_up, down, k, True, norm, shared)
    close(out, reference.sparse_moe(x, logits, gate_up, down, k, True, norm, shared), MOE_TOL[torch.bfloat16])
