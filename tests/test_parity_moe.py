"""Parity of our MoE decoders (python_backends/models/qwen3_moe.py, qwen3_5_moe.py on models/moe.py)
with transformers' `Qwen3MoeForCausalLM` and `Qwen3_5MoeForCausalLM`, on tiny random fp32 models, CPU
only: logits at every prompt token and over decode steps of several sequences at once, greedy tokens
through the engine, and the checkpoint layouts the released models use.

Every parameter gets random values large enough that each layer, and each expert's choice, visibly
changes the logits; the router sends tokens to a few experts unevenly and leaves others empty.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.sampling import SamplingParams
from triton_omni.kernels import dispatch
from triton_omni.models.loader import load_weights
from triton_omni.models.registry import build_causal_lm, load_causal_lm
from tests.test_parity_qwen3_5 import ManualCache, hf_greedy, hf_logits

transformers = pytest.importorskip("transformers")
from transformers import (Qwen3_5MoeConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig,  # noqa: E402
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

pytestmark = pytest.mark.parity

VOCAB = 300
LIN, FULL = "linear_attention", "full_attention"
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, max_position_embeddings=256,
              rms_norm_eps=1e-6)
VARIANTS = {
    # a sparse layer and a dense one (mlp_only_layers), top k renormalised, tied embeddings
    "qwen3_moe": (Qwen3MoeForCausalLM, lambda: Qwen3MoeConfig(
        intermediate_size=96, num_hidden_layers=2, mlp_only_layers=[1], norm_topk_prob=True, tie_word_embeddings=True,
        **COMMON)),
    # 3 DeltaNet layers + 1 attention layer, every MLP sparse with a shared expert, untied
    "qwen3_5_moe": (Qwen3_5MoeForCausalLM, lambda: Qwen3_5MoeTextConfig(
        num_hidden_layers=4, layer_types=[LIN, LIN, LIN, FULL], linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, shared_expert_intermediate_size=48,
        tie_word_embeddings=False, **COMMON)),
}
PROMPT_LENS = [5, 23, 2, 11]


def randomise(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("linear_attn.norm.weight") or (name.endswith("norm.weight") and "qwen3_moe" in
                                                           model.config.model_type and "_5" not in model.config.model_type):
                p.copy_(1.0 + 0.3 * noise)                     # plain-scale norms: around 1
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * noise)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(noise * torch.linspace(1.5, 0.02, p.shape[0])[:, None])   # experts of uneven loads
            else:
                p.copy_(0.2 * noise)


def prompts(seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    """(transformers model, its checkpoint folder, our model loaded from it) for one variant."""
    cls, config = VARIANTS[request.param]
    torch.manual_seed(0)
    hf = cls(config()).eval()
    randomise(hf, seed=1)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return hf, folder, load_causal_lm(folder, "cpu", torch.float32)


def test_prefill_and_decode_logits(pair):
    """Four prompts packed in one prefill, then two decode steps of all four at once, against
    transformers' full forward of each grown sequence; the experts' loads are uneven."""
    hf, _, ours = pair
    seqs = prompts(seed=2)
    cache = ManualCache(ours, state_slots=[2, 0, 3, 1])
    logits = cache.prefill(seqs)
    start = 0
    for s in seqs:
        torch.testing.assert_close(logits[start:start + len(s)], hf_logits(hf, s), atol=1e-4, rtol=1e-4)
        start += len(s)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        for s in seqs:
            s.append(int(torch.randint(0, VOCAB, (1,), generator=gen)))
        ref = torch.stack([hf_logits(hf, s)[-1] for s in seqs])
        torch.testing.assert_close(cache.decode(seqs), ref, atol=1e-4, rtol=1e-4)
    # the routing is uneven: the busiest expert gets several times the tokens of the idlest
    block = next(m for m in ours.modules() if hasattr(m, "experts"))
    with torch.no_grad():
        h = ours.model.embed_tokens(torch.tensor([t for s in seqs for t in s]))
        _, ids = torch.topk(block.router(h)[:, :block.num_experts], block.top_k)
    loads = torch.bincount(ids.flatten(), minlength=block.num_experts)
    assert loads.max() >= 3 * loads.min(), loads


def test_greedy_generation_continuous_batching(pair):
    """Three sequences decoded together through the engine equal transformers' generate, one by one."""
    hf, _, ours = pair
    seqs = prompts(seed=4)[:3]
    engine = LLMEngine(ours, EngineConfig(max_num_seqs=4, max_model_len=128), "cpu", torch.float32,
                       eos_token_ids=[], vocab_size=VOCAB)
    outs = engine.generate(seqs, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    assert outs == [hf_greedy(hf, p, 10) for p in seqs]
    assert engine.stats.max_decode_batch == 3
    assert all(len(set(o)) > 3 for o in outs), "degenerate outputs: the random weights are too weak"


def stacked(tensors: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """The per-expert tensors stacked as transformers 5 keeps them (and Qwen3.5-MoE releases store them):
    experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]."""
    out, layers = {}, sorted({k.split(".experts.")[0] for k in tensors if ".experts." in k})
    for k, v in tensors.items():
        if ".experts." not in k:
            out[k] = v
    for prefix in layers:
        per = lambda p: [tensors[f"{prefix}.experts.{e}.{p}.weight"] for e in range(num_experts)]  # noqa: E731
        out[f"{prefix}.experts.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in
                                                             zip(per("gate_proj"), per("up_proj"))]).contiguous()
        out[f"{prefix}.experts.down_proj"] = torch.stack(per("down_proj")).contiguous()
    return out


def test_stacked_experts_and_multimodal_layout_load(pair, tmp_path):
    """A checkpoint with stacked experts loads as the per-expert one; Qwen3.5-MoE's also as a
    Qwen3_5MoeForConditionalGeneration folder (decoder under model.language_model.*, vision and MTP
    tensors that the text decoder does not use)."""
    hf, folder, ours = pair
    tensors = stacked(load_file(str(folder / "model.safetensors")), hf.config.num_experts)
    assert not any(".experts.0." in k for k in tensors)
    if isinstance(hf, Qwen3_5MoeForCausalLM):
        tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
                   for k, v in tensors.items()}
        tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.randn(24, 8)
        tensors["mtp.fc.weight"] = torch.randn(64, 128)
        Qwen3_5MoeConfig(text_config=hf.config.to_dict(), vision_config={"depth": 1, "hidden_size": 8},
                         tie_word_embeddings=False).save_pretrained(tmp_path)
    else:
        hf.config.save_pretrained(tmp_path)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = load_causal_lm(tmp_path, "cpu", torch.float32)
    for name, p in ours.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], p), name


def test_expert_tensors_out_of_place_or_missing_fail_by_name(pair):
    """An expert index past the layer's experts, a wrong shape, a missing expert: named errors (what the
    converter's checkpoint check reports)."""
    hf, folder, _ = pair
    tensors = dict(load_file(str(folder / "model.safetensors")))
    model = build_causal_lm(folder, "meta")
    name = next(k for k in tensors if ".experts.3.up_proj." in k)
    extra = {**tensors, name.replace(".experts.3.", ".experts.8."): tensors[name]}
    with pytest.raises(KeyError, match="expert 8 of a layer with 8 experts"):
        load_weights(model, folder, extra.items())
    wrong = {**tensors, name: tensors[name][:, :-1]}
    with pytest.raises(ValueError, match=r"expert 3 up_proj: checkpoint shape \(32, 63\) != model \(32, 64\)"):
        load_weights(model, folder, wrong.items())
    gone = {k: v for k, v in tensors.items() if k != name}
    with pytest.raises(KeyError, match=r"checkpoint lacks 1 parameter\(s\), e.g. \['model.layers.0.mlp.experts.gate_up_proj'\]"):
        load_weights(model, folder, gone.items())


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
def test_decode_through_the_moe_kernels(pair, monkeypatch):
    """Qwen3.5-MoE's blocks through the Triton kernels (the interpreter on a CPU) instead of the torch
    path: the router's merged projection, the shared expert's views and the zero-centred norm as the
    model hands them, at one token (the decode kernels) and at two prompts (the grouped path)."""
    moe = pytest.importorskip("triton_omni.kernels.moe")
    hf, _, ours = pair
    if not isinstance(hf, Qwen3_5MoeForCausalLM):
        pytest.skip("the Qwen3.5-MoE block covers Qwen3-MoE's (no shared expert) too; the interpreter is slow")
    monkeypatch.setattr(dispatch, "sparse_moe", moe.sparse_moe)
    seqs = [s[:6] for s in prompts(seed=5)[:2]]
    cache = ManualCache(ours, state_slots=[0, 1])
    logits = cache.prefill(seqs)
    ends = torch.tensor([len(s) for s in seqs]).cumsum(0) - 1
    torch.testing.assert_close(logits[ends], torch.stack([hf_logits(hf, s)[-1] for s in seqs]), atol=1e-4, rtol=1e-4)
    one = ManualCache(ours, state_slots=[1])
    one.prefill(seqs[:1])
    seqs[0].append(7)
    torch.testing.assert_close(one.decode(seqs[:1]), hf_logits(hf, seqs[0])[-1:], atol=1e-4, rtol=1e-4)


def test_fp8_weights_are_refused_by_name(pair):
    """FP8 weights (models/quant.py) cover the dense projections only: a MoE model refuses them, naming
    the parameter, instead of serving its experts and router half converted."""
    _, folder, _ = pair
    with pytest.raises(ValueError, match="parameter 'quantization': fp8 is not supported for mixture-of-experts"):
        load_causal_lm(folder, "cpu", torch.bfloat16, quantization="fp8")
