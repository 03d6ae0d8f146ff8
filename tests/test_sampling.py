"""Sampling parameters (validation) and the batched, seeded sampler."""
from __future__ import annotations

import pytest
import torch

from triton_omni.ar.sampling import SamplingParams, gumbel_noise, sample
from triton_omni.runtime.errors import InvalidInput


@pytest.mark.parametrize("raw,field", [
    ({"temperture": 1.0}, "sampling_parameters"),
    ({"max_tokens": 0}, "sampling_parameters.max_tokens"),
    ({"temperature": -1}, "sampling_parameters.temperature"),
    ({"top_p": 0}, "sampling_parameters.top_p"),
    ({"top_k": -2}, "sampling_parameters.top_k"),
    ({"top_k": 2 ** 40}, "sampling_parameters.top_k"),              # the engine keeps it in int64 rows
    ({"seed": 2 ** 64}, "sampling_parameters.seed"),
    ({"stop": [1]}, "sampling_parameters.stop"),
    ({"stop": [""]}, "sampling_parameters.stop"),
    ({"ignore_eos": "yes"}, "sampling_parameters.ignore_eos"),
    ({"max_tokens": "ten"}, "sampling_parameters.max_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "sampling_parameters.min_tokens"),
    ([1, 2], "sampling_parameters"),
])
def test_bad_sampling_parameters(raw, field):
    with pytest.raises(InvalidInput) as err:
        SamplingParams.from_dict(raw)
    assert err.value.field == field


def test_numbers_may_come_as_strings():
    """genai-perf (--backend vllm) sends "16" for 16."""
    p = SamplingParams.from_dict({"max_tokens": "16", "temperature": "0.5", "min_tokens": "16"})
    assert (p.max_tokens, p.temperature, p.min_tokens) == (16, 0.5, 16)


def test_resolve_checks_context():
    p = SamplingParams.from_dict({"max_tokens": 10, "stop": "x"})
    assert p.stop == ["x"]
    assert p.resolve(prompt_len=5, max_model_len=15, vocab_size=100).max_tokens == 10
    with pytest.raises(InvalidInput, match="max_tokens': 10 does not fit"):
        p.resolve(prompt_len=6, max_model_len=15, vocab_size=100)
    with pytest.raises(InvalidInput, match="field 'prompt'"):
        SamplingParams().resolve(prompt_len=15, max_model_len=15, vocab_size=100)
    assert SamplingParams().resolve(prompt_len=10, max_model_len=15, vocab_size=100).max_tokens == 5
    r = SamplingParams().resolve(prompt_len=1, max_model_len=15, vocab_size=100)
    assert r.seed is not None


def test_the_resolved_form_round_trips_without_checks():
    """The pre step resolves once; the AR step takes its JSON as it is (from_resolved) and the engine
    checks only that it fits its own context."""
    r = SamplingParams.from_dict({"top_k": 5, "stop": "x"}).resolve(prompt_len=4, max_model_len=20, vocab_size=100)
    assert r.resolved and not SamplingParams().resolved
    assert SamplingParams.from_resolved(r.to_dict()) == r
    assert SamplingParams.from_resolved(None) == SamplingParams()
    assert r.check_fits(prompt_len=4, max_model_len=20) == 16
    with pytest.raises(InvalidInput, match="max_tokens': 16 does not fit"):
        r.check_fits(prompt_len=4, max_model_len=19)


def _run(logits, rows, steps=None, temperature=1.0, top_k=0, top_p=1.0):
    B = logits.shape[0]
    full = lambda v, dt: torch.full((B,), v, dtype=dt)  # noqa: E731
    return sample(logits, full(temperature, torch.float32), full(top_k, torch.int64), full(top_p, torch.float32),
                  torch.tensor(rows, dtype=torch.int64), steps if steps is not None else torch.zeros(B, dtype=torch.int64),
                  top_k > 0, top_p < 1)


def test_greedy_and_degenerate_filters_pick_argmax():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    want = logits.argmax(-1)
    assert torch.equal(_run(logits, list(range(6)), temperature=0.0), want)
    assert torch.equal(_run(logits, list(range(6)), top_k=1), want)
    assert torch.equal(_run(logits, list(range(6)), top_p=1e-6), want)


def test_seeded_rows_do_not_depend_on_batch():
    torch.manual_seed(1)
    logits = torch.randn(1, 200).repeat(5, 1)
    seeds = [7, 8, 7, 9, 7]
    batch = _run(logits, seeds)
    alone = torch.stack([_run(logits[:1], [s])[0] for s in seeds])
    assert torch.equal(batch, alone)
    assert batch[0] == batch[2] == batch[4]


def test_top_k_and_top_p_restrict_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(400, 1)
    seeds = list(range(400))
    steps = torch.arange(400)
    assert set(_run(logits, seeds, steps, top_k=2).tolist()) == {0, 1}
    probs = logits[0].softmax(-1)   # 0.64, 0.24, 0.09, ...: top_p=0.8 keeps the first two
    assert set(_run(logits, seeds, steps, top_p=0.8).tolist()) == {0, 1}
    assert probs[:2].sum() > 0.8 > probs[0]


def test_sampling_follows_the_softmax():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(20000, 1)
    draws = _run(logits, [3] * 20000, torch.arange(20000))
    freq = torch.bincount(draws, minlength=4).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.015), freq


def test_gumbel_noise_is_deterministic_and_standard():
    g1 = gumbel_noise(torch.tensor([5, 6]), torch.tensor([0, 0]), 10000)
    g2 = gumbel_noise(torch.tensor([5, 6]), torch.tensor([0, 0]), 10000)
    assert torch.equal(g1, g2) and not torch.equal(g1[0], g1[1])
    assert abs(g1.mean().item() - 0.5772) < 0.03          # Euler-Mascheroni
