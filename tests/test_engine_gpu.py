"""The AR engine on a GPU: CUDA-graph decode equals eager decode and transformers; padding rows of a
graph bucket never disturb real sequences. Skipped without CUDA (run on the GPU machine)."""
from __future__ import annotations

import pytest
import torch

from python_backends.ar.config import EngineConfig
from python_backends.ar.engine import LLMEngine
from python_backends.ar.sampling import SamplingParams
from python_backends.models.registry import load_causal_lm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = [[5, 6, 7, 8, 9], [40, 41], [100 + i for i in range(30)], [7] * 12, [300, 200, 100]]


def engine(folder, eager: bool, dtype=torch.float32, **kw):
    from kernels import dispatch

    dispatch.enable(True)
    model = load_causal_lm(folder, "cuda", dtype)
    cfg = EngineConfig(**{"max_num_seqs": 8, "max_model_len": 256, "enforce_eager": eager,
                          "cuda_graph_batch_sizes": [1, 2, 4, 8], **kw})
    e = LLMEngine(model, cfg, "cuda", dtype, eos_token_ids=[], vocab_size=model.config.vocab_size)
    assert e.runner.use_graphs == (not eager)
    return e


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
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
