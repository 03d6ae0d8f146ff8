"""Parity of our Llama decoder (python_backends/models/llama.py) with transformers' own
`LlamaForCausalLM`, on tiny random fp32 models written by `save_pretrained` (the real parameter
names), CPU only: logits at every prompt token, and greedy decoding through the engine.

Variants cover what Llama checkpoints differ in: llama3 rope scaling (Llama 3.x, Orpheus) with tied
embeddings and grouped KV heads; plain rope with q/k/v/o and MLP biases, untied, one KV head per
query head; linear rope scaling.
"""
from __future__ import annotations

import pytest
import torch

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.sampling import SamplingParams
from triton_omni.models.llama import LlamaForCausalLM as OurLlama
from triton_omni.models.registry import load_causal_lm

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

pytestmark = pytest.mark.parity


VOCAB = 300
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
VARIANTS = {
    "llama3_tied_gqa": dict(num_key_value_heads=2, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE),
    "bias_untied_mha": dict(num_key_value_heads=4, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "linear_rope": dict(num_key_value_heads=1, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
}
PROMPTS = [[5, 6, 7, 8, 9], [40, 41], [100 + i for i in range(70)], [7] * 12]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                         **VARIANTS[request.param])
    torch.manual_seed(11)
    hf = LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(12)
    with torch.no_grad():                  # every parameter visibly matters (no identity-like init)
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.3 * noise)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(str(folder))
    return folder, hf


def test_loads_by_checkpoint_names(checkpoint):
    """Every checkpoint tensor has its place (q/k/v and gate/up in the fused projections)."""
    folder, hf = checkpoint
    model = load_causal_lm(folder, "cpu", torch.float32)
    assert isinstance(model, OurLlama)
    ours = dict(model.named_parameters(remove_duplicate=False))
    for name in hf.state_dict():
        for frag, (merged, _) in OurLlama.packed.items():
            name = name.replace(f".{frag}.", f".{merged}.")
        assert name in ours, name


def test_prefill_logits_match_transformers(checkpoint):
    folder, hf = checkpoint
    model = load_causal_lm(folder, "cpu", torch.float32)
    engine = LLMEngine(model, EngineConfig(max_num_seqs=8, max_model_len=256), "cpu", torch.float32, [], VOCAB)
    seqs = [engine.add(p, SamplingParams(max_tokens=1)) for p in PROMPTS]
    engine._drain_inbox()
    batch = engine.scheduler.schedule()
    with torch.inference_mode():
        ours = engine.runner.prefill_logits(batch.seqs, all_tokens=True)
    start = 0
    for s in seqs:
        with torch.no_grad():
            ref = hf(torch.tensor([s.prompt_ids])).logits[0]
        n = len(s.prompt_ids)
        assert ref.std() > 0.5            # the random weights move the logits
        torch.testing.assert_close(ours[start:start + n], ref, atol=2e-4, rtol=2e-4)
        start += n


def test_batched_greedy_equals_transformers(checkpoint):
    folder, hf = checkpoint
    model = load_causal_lm(folder, "cpu", torch.float32)
    engine = LLMEngine(model, EngineConfig(max_num_seqs=8, max_model_len=256), "cpu", torch.float32, [], VOCAB)
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    for p, o in zip(PROMPTS, outs):
        ids = torch.tensor([p])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                          eos_token_id=None, pad_token_id=None)[0, len(p):].tolist()
        assert o == ref
    assert len({tuple(o) for o in outs}) == len(PROMPTS)


def test_tiny_orpheus_talker_matches_transformers(tiny_checkpoints):
    """The served talker checkpoint (29k vocabulary, llama3 rope) through the engine."""
    folder = tiny_checkpoints["orpheus"]
    hf = LlamaForCausalLM.from_pretrained(folder).eval()
    model = load_causal_lm(folder, "cpu", torch.float32)
    engine = LLMEngine(model, EngineConfig(max_num_seqs=4, max_model_len=256), "cpu", torch.float32, [],
                       model.config.vocab_size)
    prompt = [515, 0, 300, 301, 302, 2, 516, 517, 513]
    out = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    ids = torch.tensor([prompt])
    ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                      eos_token_id=None, pad_token_id=None)[0, len(prompt):].tolist()
    assert out == ref
