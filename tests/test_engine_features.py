"""The AR engine's request features in-process on the tiny Qwen3 (and Qwen3.5): prefix caching
(answers equal without it, evictions forced, shared blocks never freed), n > 1 forks, the logits
processors against transformers' and the plain reference, structured output's masks."""
from __future__ import annotations

import json
import random

import pytest
import torch

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.logits_processors import Features, RowLogits, reference_process
from triton_omni.ar.prefix_cache import PrefixCache
from triton_omni.ar.sampling import SamplingParams
from triton_omni.models.registry import load_causal_lm

GREEDY = dict(temperature=0, ignore_eos=True)


def make_engine(folder, grammar=None, **kw) -> LLMEngine:
    model = load_causal_lm(folder, "cpu", torch.float32)
    config = EngineConfig(**{"max_num_seqs": 8, "max_model_len": 256, **kw})
    return LLMEngine(model, config, "cpu", torch.float32, eos_token_ids=[], vocab_size=model.config.vocab_size,
                     grammar=grammar)


def shared_prefix_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts that share long heads (two system prompts, some repeated turns), as a chat service sees."""
    rng = random.Random(seed)
    systems = [[rng.randrange(3, 500) for _ in range(50)] for _ in range(4)]
    heads = [systems[i % 4 if i < n // 2 else (i // 2) % 4] for i in range(n)]
    return [h + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 30))] for h in heads]


def test_prefix_cache_answers_equal_no_cache_with_evictions(tiny_checkpoints):
    folder = tiny_checkpoints["qwen3"]
    prompts = shared_prefix_prompts(12)
    sp = SamplingParams(max_tokens=6, **GREEDY)
    want = make_engine(folder, enable_prefix_caching=False).generate(prompts, sp)
    # 16 blocks of 16 tokens: two or three sequences at a time; their cached blocks are soon evicted
    cached = make_engine(folder, num_kv_blocks=16, max_model_len=128)
    got = []
    for i in range(0, len(prompts), 3):             # arrivals in small waves: later ones find earlier blocks
        got += cached.generate(prompts[i:i + 3], sp)
    assert got == want
    stats = cached.stats
    assert 0 < stats.cached_tokens < stats.prompt_tokens and stats.prefill_tokens == stats.prompt_tokens - stats.cached_tokens
    cache = cached.blocks.cache
    assert all(r == 0 for r in cache.refs) and cache.num_available() == 16
    assert cache.evictions > 0, "the small cache should have evicted blocks"


def test_a_shared_block_is_never_freed_or_reused_while_held(tiny_checkpoints):
    e = make_engine(tiny_checkpoints["qwen3"], num_kv_blocks=16, max_model_len=64)
    head = list(range(10, 42))                         # two full blocks
    a = e.add(head + [50, 51], SamplingParams(max_tokens=20, **GREEDY))
    e.step()                                           # a: prefilled, its blocks cached
    b = e.add(head + [60], SamplingParams(max_tokens=20, **GREEDY))
    e.step()
    assert b.num_cached == 32 and b.block_table[:2] == a.block_table[:2]
    shared = a.block_table[:2]
    e.abort(a)
    while a.status.value != "finished":
        e.step()
    cache = e.blocks.cache
    assert all(cache.refs[x] == 1 for x in shared) and not set(shared) & set(e.blocks.free_blocks)
    # fill the cache with others while b runs: none of them may get b's blocks
    others = [e.add([300 + i] * 17, SamplingParams(max_tokens=20, **GREEDY)) for i in range(3)]
    e.step()
    held = {x for s in others if s.block_table for x in s.block_table}
    assert not held & set(b.block_table)
    with pytest.raises(AssertionError, match="released more often"):
        c = PrefixCache(2)
        c.release(c.allocate(1)[0])
        c.release(0)
    e.run_until_done()
    assert all(r == 0 for r in cache.refs)


def test_forks_share_one_prefill_and_draw_their_own_samples(tiny_checkpoints):
    folder = tiny_checkpoints["qwen3"]
    e = make_engine(folder)
    prompt = list(range(5, 40))
    seq = e.add(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=9, n=3, ignore_eos=True))
    e.run_until_done()
    outs = [seq.output_ids] + [f.output_ids for f in seq.forks]
    assert e.stats.prefill_tokens == len(prompt) and len({tuple(o) for o in outs}) == 3
    # each fork equals the same request sampled alone with that fork's seed
    for fork in seq.forks:
        alone = make_engine(folder).generate([prompt], SamplingParams(max_tokens=8, temperature=1.0,
                                                                      seed=fork.params.seed, ignore_eos=True))
        assert alone[0] == fork.output_ids


def test_qwen3_5_forks_copy_the_recurrent_state(tiny_checkpoints):
    folder = tiny_checkpoints["qwen3_5"]
    e = make_engine(folder)
    assert not e.prefix_caching                     # recurrent layers: see LLMEngine
    prompt = list(range(5, 30))
    seq = e.add(prompt, SamplingParams(max_tokens=6, n=2, **GREEDY))
    e.run_until_done()
    assert seq.forks[0].output_ids == seq.output_ids == make_engine(folder).generate([prompt], SamplingParams(
        max_tokens=6, **GREEDY))[0]


@pytest.mark.parity
def test_processors_equal_transformers_and_the_reference():
    from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

    torch.manual_seed(0)
    V, rows = 40, 4
    logits = torch.randn(3, V) * 3
    proc = RowLogits(rows, V, 4, torch.device("cpu"))

    class S:                                 # what RowLogits.admit reads of a sequence
        def __init__(self, prompt, p, row):
            self.prompt_ids, self.params, self.thinking, self.thinking_left, self.row = prompt, p, False, -1, row

    params = [SamplingParams(repetition_penalty=1.4, presence_penalty=0.3, frequency_penalty=0.5),
              SamplingParams(logit_bias={"3": 5.0, "7": -2.0}),
              SamplingParams(repetition_penalty=0.8)]
    prompts, generated = [[1, 2, 3], [4], [5, 5, 9]], [[2, 6, 6], [], [9, 1]]
    rows_t = torch.tensor([2, 0, 1])
    seqs = [S(p, sp, r) for p, sp, r in zip(prompts, params, rows_t.tolist())]
    proc.admit(seqs, rows_t, lambda v, dt=torch.int64: torch.tensor(v, dtype=dt))
    for r, g in zip(rows_t.tolist(), generated):
        for t in g:
            proc.counts[r, t] += 1
    seen = []
    f = Features(penalties=True, bias=True)
    proc.sample(logits, rows_t, f, lambda x: seen.append(x) or x.argmax(-1))
    for i, (p, g, sp) in enumerate(zip(prompts, generated, params)):
        want = reference_process(logits[i], p, g, sp)
        torch.testing.assert_close(seen[0][i], want)
        if sp.presence_penalty == 0 and not sp.logit_bias:     # transformers' processor alone
            hf = RepetitionPenaltyLogitsProcessor(sp.repetition_penalty)(torch.tensor([p + g]), logits[i:i + 1].clone())
            torch.testing.assert_close(seen[0][i], hf[0])
    # min_p: the sampler's kept set equals transformers' MinPLogitsWarper after temperature
    from triton_omni.ar.sampling import sample

    x = logits[:1]
    kept = set()
    for s in range(200):
        kept.add(int(sample(x, torch.tensor([0.7]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([s]),
                            torch.tensor([0]), False, False, torch.tensor([0.2]))))
    hf = MinPLogitsWarper(0.2)(None, TemperatureLogitsWarper(0.7)(None, x.clone()))
    assert kept <= set(torch.nonzero(hf[0] > float("-inf")).flatten().tolist())


def test_grammar_rows_batch_with_free_rows(tiny_checkpoints):
    import jsonschema

    from triton_omni.ar.grammar import GrammarCompiler
    from triton_omni.text.tokenizer import load_tokenizer, token_byte_table

    folder = tiny_checkpoints["qwen3"]
    tok = load_tokenizer(folder)
    e = make_engine(folder, GrammarCompiler(token_byte_table(tok), len(tok), [tok.eos_token_id]))
    e.eos_token_ids = {tok.eos_token_id}
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "bb"]}, "v": {"type": "integer", "minimum": 0,
                                                                                 "maximum": 9}},
              "required": ["k", "v"]}
    free = e.add(list(range(5, 20)), SamplingParams(max_tokens=30, temperature=1.0, seed=1, ignore_eos=True))
    bound = [e.add(list(range(5 + i, 20)), SamplingParams(max_tokens=60, temperature=1.0, seed=i,
                                                          guided_decoding={"json": schema})) for i in range(3)]
    e.run_until_done()
    assert e.stats.max_decode_batch == 4, "constrained rows decode in the same steps as the free one"
    for s in bound:
        assert s.finish_reason == "stop"
        jsonschema.validate(json.loads(tok.decode(s.output_ids, skip_special_tokens=True)), schema)
    assert len(free.output_ids) == 30
