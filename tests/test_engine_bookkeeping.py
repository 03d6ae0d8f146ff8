"""The decode engine's bookkeeping kernels (ar/bookkeeping.py) against their torch references
(ar/bookkeeping_reference.py).

On a machine with CUDA the kernels run for real (fp32, bf16 and fp16); without it they run under the
Triton interpreter on the CPU (fp32 only, small shapes: the interpreter is slow).
"""
from __future__ import annotations

import pytest
import torch

from tests.kernel_cases import DEVICE, DTYPES, INTERPRETER_WARNINGS, generator, randn
from triton_omni.ar import bookkeeping as ops, bookkeeping_reference as reference

pytestmark = INTERPRETER_WARNINGS


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
    x = randn(B, V, dtype=dtype, gen=generator(21))
    if V > ops.ARGMAX_CHUNK:
        x[0, ops.ARGMAX_CHUNK - 1] = 50.0                  # last of the first chunk
        x[1, V - 1] = 50.0                                 # the very last
        x[-1, 100] = x[-1, ops.ARGMAX_CHUNK + 3] = 60.0    # a tie across chunks
    out = ops.argmax(x)
    assert out.dtype == torch.int64 and torch.equal(out, x.argmax(-1)), (out, x.argmax(-1))
    if V > ops.ARGMAX_CHUNK:
        assert out[-1].item() == 100
    assert not ops._row_counters(x.device, 1).any()          # the next launch counts from 0 again
