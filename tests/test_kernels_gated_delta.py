"""kernels/gated_delta.py's Triton kernels against their torch references (kernels/gated_delta_reference.py).

On a machine with CUDA the kernels run for real (fp32, bf16 and fp16); without it they run under the
Triton interpreter on the CPU (fp32 only, small shapes: the interpreter is slow).
"""
from __future__ import annotations

import pytest
import torch

from tests.kernel_cases import ATTN_TOL, DEVICE, DTYPES, INTERPRETER_WARNINGS, TOL, close, generator, randn
from triton_omni.kernels import gated_delta as ops, gated_delta_reference as reference

pytestmark = INTERPRETER_WARNINGS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens,C,K", [([3, 7], 40, 4), ([2, 19, 1, 33], 300, 4), ([5, 3], 64, 2)])
def test_causal_conv1d_prefill(dtype, lens, C, K):
    """Packed prompts (some shorter than the window): no tap crosses into the prompt before."""
    g = generator(17)
    T = sum(lens)
    x = randn(T, C + 9, dtype=dtype, gen=g)[:, :C]                  # a strided slice of a projection
    w = randn(C, K, dtype=dtype, gen=g)
    positions = torch.cat([torch.arange(n) for n in lens]).to(DEVICE)
    out = ops.causal_conv1d_prefill(x, w, positions)
    close(out, reference.causal_conv1d_prefill(x, w, positions), TOL[dtype])
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
    g = generator(18)
    total = sum(lens)
    T = total + pad
    mixed = randn(T, 2 * Hk * DK + Hv * DV + 3, dtype=dtype, gen=g)[:, 3:]        # a strided conv output
    q, k, v = mixed.split([Hk * DK, Hk * DK, Hv * DV], dim=-1)
    q, k, v = q.view(T, Hk, DK), k.view(T, Hk, DK), v.view(T, Hv, DV)
    ab = randn(T, 2 * Hv, dtype=dtype, gen=g)
    a, b = ab[:, :Hv], ab[:, Hv:]
    A_log, dt_bias = randn(Hv, dtype=dtype, gen=g) * 0.5, randn(Hv, dtype=dtype, gen=g)
    n, scratch = len(lens), len(lens) + 2
    state = randn(scratch + 1, Hv, DK, DV, dtype=torch.float32, gen=g)             # stale slots
    slots = torch.tensor([*reversed(range(n)), *[scratch] * empty], device=DEVICE)
    before = state.clone()
    out = _delta_prefill(q, k, v, a, b, A_log, dt_bias, lens + [0] * empty, state, slots, num_tokens=T)
    layout = reference.ChunkLayout.build(lens, reference.DELTA_CHUNK, DEVICE)
    ref_out, ref_states = reference.gated_delta_prefill(q[:total], k[:total], v[:total], a[:total], b[:total],
                                                        A_log, dt_bias, layout)
    close(out[:total], ref_out, (2e-5, 1e-4))
    close(state[slots[:n]], ref_states, (2e-5, 1e-4))
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
    g = generator(13)
    slots_total = 7
    x = randn(B, C + 5, dtype=dtype, gen=g)[:, :C]                  # a strided slice of a projection
    state = randn(slots_total, C, K - 1, dtype=dtype, gen=g)
    w = randn(C, K, dtype=dtype, gen=g)
    slots = torch.randperm(slots_total, generator=g, device=DEVICE)[:B]
    ref_state = state.clone()
    out = ops.causal_conv1d_update(x, state, w, slots)
    ref = reference.causal_conv1d_update(x, ref_state, w, slots)
    close(out, ref, TOL[dtype])
    assert torch.equal(state, ref_state)                            # the window shifts exactly


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hk,Hv,DK,DV", [(1, 2, 4, 16, 16), (3, 1, 2, 32, 24), (2, 2, 2, 128, 128)])
def test_gated_delta_decode(dtype, B, Hk, Hv, DK, DV):
    g = generator(14)
    slots_total = 5
    width = 2 * Hk * DK + Hv * DV
    mixed = randn(B, width, dtype=dtype, gen=g)
    q, k, v = mixed.split([Hk * DK, Hk * DK, Hv * DV], dim=-1)
    q, k, v = q.view(B, Hk, DK), k.view(B, Hk, DK), v.view(B, Hv, DV)
    proj = randn(B, Hv * DV + 2 * Hv, dtype=dtype, gen=g)
    z, b, a = proj.split([Hv * DV, Hv, Hv], dim=-1)
    z = z.view(B, Hv, DV)
    A_log, dt_bias = randn(Hv, dtype=dtype, gen=g) * 0.5, randn(Hv, dtype=dtype, gen=g)
    norm_w = 1 + 0.1 * randn(DV, dtype=dtype, gen=g)
    state = randn(slots_total, Hv, DK, DV, gen=g) * 0.3
    slots = torch.randperm(slots_total, generator=g, device=DEVICE)[:B]
    ref_state = state.clone()
    out = ops.gated_delta_decode(q, k, v, a, b, A_log, dt_bias, state, slots, z, norm_w, 1e-6)
    ref = reference.gated_delta_decode(q, k, v, a, b, A_log, dt_bias, ref_state, slots, z, norm_w, 1e-6)
    close(out, ref, ATTN_TOL[dtype])
    torch.testing.assert_close(state, ref_state, atol=1e-5, rtol=1e-5)
