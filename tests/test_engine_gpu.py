"""The AR engine on a GPU: CUDA-graph decode equals eager decode and transformers; padding rows of a
graph bucket never disturb real sequences. Skipped without CUDA (run on the GPU machine)."""
from __future__ import annotations

import pytest
import torch

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.sampling import SamplingParams
from triton_omni.models.registry import load_causal_lm
from tests.conftest import admitted_prompts, prefill_twice

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = [[5, 6, 7, 8, 9], [40, 41], [100 + i for i in range(30)], [7] * 12, [300, 200, 100]]


def engine(folder, eager: bool, dtype=torch.float32, **kw):
    from triton_omni.kernels import dispatch

    dispatch.enable(True)
    model = load_causal_lm(folder, "cuda", dtype)
    cfg = EngineConfig(**{"max_num_seqs": 8, "max_model_len": 256, "enforce_eager": eager,
                          "cuda_graph_batch_sizes": [1, 2, 4, 8], **kw})
    e = LLMEngine(model, cfg, "cuda", dtype, eos_token_ids=[], vocab_size=model.config.vocab_size)
    assert e.runner.use_graphs == (not eager)
    return e


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5", "qwen3_moe", "qwen3_5_moe"])
def test_graph_decode_equals_eager_and_one_by_one(tiny_checkpoints, name):
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    seeded = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, top_k=40, seed=5, ignore_eos=True)
    for params in (greedy, seeded):
        eager = engine(tiny_checkpoints[name], eager=True).generate(PROMPTS, params)
        g = engine(tiny_checkpoints[name], eager=False)
        graphs = g.generate(PROMPTS, params)                   # 5 sequences: bucket 8, 3 padding rows
        alone = [g.generate([p], params)[0] for p in PROMPTS]  # bucket 1
        assert graphs == eager == alone
        assert len(g.runner.graphs) >= 2


def test_graph_decode_equals_transformers(tiny_checkpoints):
    from transformers import AutoModelForCausalLM

    folder = tiny_checkpoints["qwen3"]
    hf = AutoModelForCausalLM.from_pretrained(folder).cuda().eval()
    outs = engine(folder, eager=False).generate(PROMPTS, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    for p, o in zip(PROMPTS, outs):
        ids = torch.tensor([p], device="cuda")
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                          eos_token_id=None, pad_token_id=None)[0, len(p):].tolist()
        assert o == ref


def test_bf16_graphs_run_and_stop_on_device(tiny_checkpoints):
    e = engine(tiny_checkpoints["qwen3"], eager=False, dtype=torch.bfloat16)
    free = e.generate([PROMPTS[0]], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    stop = free[5]
    out = e.generate([PROMPTS[0]], SamplingParams(max_tokens=16, temperature=0, stop_token_ids=[stop]))[0]
    assert out == free[:free.index(stop)]


@pytest.mark.parametrize("buckets,max_model_len", [([16, 64], 256), ([16, 128], 48)])
def test_prefill_graph_equals_eager_prefill_and_writes_only_the_prompts_slots(tiny_checkpoints, buckets, max_model_len):
    """bf16 (the varlen kernel's types): three prompts (37 tokens) replayed in a prefill graph give
    the eager prefill's last hidden states and the same cache rows for their slots; the padding
    tokens (27, or 91: longer than any prompt may be, so attention leaves most of them unwritten)
    write no slot."""
    e = engine(tiny_checkpoints["qwen3"], eager=False, dtype=torch.bfloat16, cuda_graph_prefill_tokens=buckets,
               max_model_len=max_model_len)
    r = e.runner
    assert r.use_prefill_graphs
    r.capture_graphs()
    assert sorted(r.prefill_graphs) == buckets
    seqs = admitted_prompts(e, PROMPTS[:3])
    layer = r.layers[0][0]
    slots = torch.tensor([b * e.blocks.block_size + i % e.blocks.block_size
                          for s in seqs for i, b in ((i, s.block_table[i // e.blocks.block_size]) for i in range(s.prompt_len))])
    others = torch.ones(layer.k_cache.shape[0] * layer.k_cache.shape[1], dtype=torch.bool)
    others[slots] = False
    eager, _, (k_eager,), (stale,) = prefill_twice(r, seqs, [layer.k_cache], lambda: graph_prefill(r, seqs))
    torch.testing.assert_close(r.first_hidden[:3].float(), eager.float(), atol=5e-2, rtol=5e-2)
    flat, flat_eager, flat_stale = (c.view(-1, *c.shape[2:]) for c in (layer.k_cache, k_eager, stale))
    torch.testing.assert_close(flat[slots].float(), flat_eager[slots].float(), atol=5e-2, rtol=5e-2)
    assert torch.equal(flat[others.cuda()], flat_stale[others.cuda()])


def graph_prefill(runner, seqs) -> None:
    """runner.prefill(seqs) through its graph: prefill_hidden (the eager path) is taken away first."""
    runner.prefill_hidden = None
    runner.prefill(seqs).result()


def test_qwen3_5_prefill_graph_equals_eager_prefill(tiny_checkpoints, monkeypatch):
    """bf16, the delta rule through its kernels (what lets Qwen3.5 prefill in a graph): three prompts
    replayed in the 64-token bucket give the eager prefill's last hidden states and recurrent states,
    and leave the other state rows as they were."""
    from triton_omni.kernels import dispatch

    monkeypatch.setattr(dispatch, "DELTA_RULE_KERNEL", True)
    e = engine(tiny_checkpoints["qwen3_5"], eager=False, dtype=torch.bfloat16, cuda_graph_prefill_tokens=[16, 64])
    r = e.runner
    assert r.use_prefill_graphs
    r.capture_graphs()
    assert sorted(r.prefill_graphs) == [16, 64]
    seqs = admitted_prompts(e, PROMPTS[:3])
    states = [s for m, _ in r.layers for s in (getattr(m, "ssm_state", None), getattr(m, "conv_state", None))
              if s is not None]
    eager, _, after_eager, stale = prefill_twice(r, seqs, states, lambda: graph_prefill(r, seqs))
    torch.testing.assert_close(r.first_hidden[:3].float(), eager.float(), atol=5e-2, rtol=5e-2)
    rows = [s.row for s in seqs]
    others = [i for i in range(r.scratch) if i not in rows]
    for s, after, old in zip(states, after_eager, stale):
        torch.testing.assert_close(s[rows].float(), after[rows].float(), atol=5e-2, rtol=5e-2)
        assert torch.equal(s[others], old[others])


# -- request features on the GPU: the graphs of the logits processors, prefix caching's attention --------

def test_graph_decode_with_sampler_features_equals_eager(tiny_checkpoints):
    """Penalties, logit_bias, min_p, logprobs, n > 1 (forks) and grammar masks inside captured decode
    graphs give what the eager path gives, and the plain rows beside them are unchanged."""
    from triton_omni.ar.grammar import GrammarCompiler
    from triton_omni.text.tokenizer import load_tokenizer, token_byte_table

    folder = tiny_checkpoints["qwen3"]
    tok = load_tokenizer(folder)
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "bb"]}}, "required": ["k"]}
    params = [SamplingParams(max_tokens=12, temperature=0, presence_penalty=0.5, frequency_penalty=0.3,
                             repetition_penalty=1.2, logprobs=3, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0.8, min_p=0.1, seed=3, logit_bias={"40": 4.0}, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=1.0, seed=4, n=2, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=1.0, seed=5, guided_decoding={"json": schema}),
              SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)]

    def run(eager: bool):
        e = engine(folder, eager=eager)
        e.grammar = GrammarCompiler(token_byte_table(tok), len(tok), [tok.eos_token_id])
        e.eos_token_ids = {tok.eos_token_id}
        lps = []
        seqs = [e.add(p, sp, on_output=(lambda s, new, r: lps.append(s.new_logprobs)) if i == 0 else None)
                for i, (p, sp) in enumerate(zip(PROMPTS, params))]
        e.run_until_done()
        return [s.output_ids for s in seqs] + [f.output_ids for s in seqs for f in s.forks], lps, e

    want, want_lp, _ = run(True)
    got, got_lp, g = run(False)
    assert got == want
    for a, b in zip(got_lp, want_lp):
        if a is not None:
            assert abs(a[0][0] - b[0][0]) < 1e-4 and [t for t, _ in a[0][1]] == [t for t, _ in b[0][1]]
    assert any(key[3] != type(key[3])() for key in g.runner.graphs), "feature graphs were captured"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefix_cached_prefill_equals_full_prefill(tiny_checkpoints, dtype):
    """A prompt whose head is cached prefills only its tail (the varlen flash kernel over K/V gathered from
    the cache, bottom-right causal) and decodes what the uncached prompt decodes."""
    folder = tiny_checkpoints["qwen3"]
    head = [5 + i for i in range(48)]
    prompts = [head + [300, 301, 302], head + [7] * 20, head[:40]]
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    want = engine(folder, eager=False, dtype=dtype, enable_prefix_caching=False).generate(prompts, sp)
    e = engine(folder, eager=False, dtype=dtype)
    got = [e.generate([p], sp)[0] for p in prompts]
    assert e.stats.cached_tokens >= 2 * 32
    if dtype == torch.float32:
        assert got == want
    else:       # bf16: a cached prefix's K/V are the same values; allow the rounding of a different kernel order
        assert sum(a == b for a, b in zip(got, want)) >= 2


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_5_moe"])
def test_moe_prefill_graph_equals_eager_prefill(tiny_checkpoints, name, monkeypatch):
    """bf16 MoE models: three prompts replayed in the 64-token prefill graph (the experts' routing,
    alignment and grouped matmuls captured, padding tokens routed too) give the eager prefill's last
    hidden states; decode graphs then run (bucket 4: the per-pair decode kernels; 8: grouped)."""
    from triton_omni.kernels import dispatch

    monkeypatch.setattr(dispatch, "DELTA_RULE_KERNEL", True)
    e = engine(tiny_checkpoints[name], eager=False, dtype=torch.bfloat16, cuda_graph_prefill_tokens=[16, 64])
    r = e.runner
    assert r.use_prefill_graphs
    r.capture_graphs()
    seqs = admitted_prompts(e, PROMPTS[:3])
    layer = next(m for m, _ in r.layers if getattr(m, "k_cache", None) is not None)
    eager, _, _, _ = prefill_twice(r, seqs, [layer.k_cache], lambda: graph_prefill(r, seqs))
    torch.testing.assert_close(r.first_hidden[:3].float(), eager.float(), atol=5e-2, rtol=5e-2)
    fresh = engine(tiny_checkpoints[name], eager=False, dtype=torch.bfloat16)
    for prompts in (PROMPTS[:3], PROMPTS):
        outs = fresh.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
        assert all(len(o) == 12 and len(set(o)) > 2 for o in outs)
