"""Parity of our Qwen3.5 decoder (python_backends/models/qwen3_5.py) with transformers' own
`Qwen3_5ForCausalLM`, on tiny random fp32 models, CPU only.

Every parameter gets random values large enough that each layer visibly changes the logits and
greedy outputs vary, so a broken layer cannot hide behind default (identity-like) initialisation.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from triton_omni.kernels import dispatch
from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.model_runner import ModelRunner
from triton_omni.ar.sampling import SamplingParams
from triton_omni.models.context import AttentionCacheSpec, ForwardContext
from triton_omni.models.registry import load_causal_lm
from tests.conftest import admitted_prompts, prefill_twice

transformers = pytest.importorskip("transformers")
from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

pytestmark = pytest.mark.parity

VOCAB = 300
LIN, FULL = "linear_attention", "full_attention"
VARIANTS = {
    # 3 DeltaNet layers + 1 attention layer; key heads shared by 2 value heads each
    "3lin1full": dict(layer_types=[LIN, LIN, LIN, FULL], linear_num_key_heads=2, linear_num_value_heads=4,
                      tie_word_embeddings=False),
    # 2 attention layers interleaved; as many key as value heads; tied embeddings; rope parameters
    # as real checkpoints spell them (mrope sections over the 2 rotary frequencies, interleaved)
    "2lin2full": dict(layer_types=[LIN, FULL, LIN, FULL], linear_num_key_heads=2, linear_num_value_heads=2,
                      tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.25,
                                       "mrope_section": [1, 1, 0], "mrope_interleaved": True}),
}
# lengths straddle the conv kernel (4) and the delta-rule chunk (64)
PROMPT_LENS = [5, 70, 2, 17]


def tiny_config(variant: str) -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,       # rotary on 4 of 16 dims
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        max_position_embeddings=256, rms_norm_eps=1e-6, **VARIANTS[variant])


def randomise(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("linear_attn.norm.weight"):      # plain-scale norm: keep it around 1
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * noise)
            else:                                              # zero-centred norms, A_log, dt_bias, linears
                p.copy_(0.2 * noise)


def prompts(seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    """(transformers model, its checkpoint folder, our model loaded from it) for one variant."""
    torch.manual_seed(0)
    hf = Qwen3_5ForCausalLM(tiny_config(request.param)).eval()
    randomise(hf, seed=1)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    ours = load_causal_lm(folder, "cpu", torch.float32)
    return hf, folder, ours


@torch.no_grad()
def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0]


@torch.no_grad()
def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    # an explicit mask: otherwise generate() takes every pad_token_id in the prompt for padding
    x = torch.tensor([ids])
    out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                      do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


class ManualCache:
    """Drives our model step by step through ForwardContexts built by hand (the engine's runner
    only binds the caches): sequence i owns KV blocks [i*m, (i+1)*m) and the given state slot."""

    def __init__(self, model, state_slots: list[int]):
        self.config = EngineConfig(max_num_seqs=4, max_model_len=128, block_size=16)
        self.runner = ModelRunner(model, self.config, torch.device("cpu"), torch.float32)
        self.model, self.state_slots = model, state_slots
        self.m = self.config.max_model_len // self.config.block_size
        # stale contents, as a slot reused from an earlier request would hold
        for module, _ in self.runner.layers:
            for name in ("conv_state", "ssm_state", "k_cache", "v_cache"):
                if getattr(module, name, None) is not None:
                    getattr(module, name).normal_()

    def slot(self, i: int, pos: int) -> int:
        bs = self.config.block_size
        return (i * self.m + pos // bs) * bs + pos % bs

    @torch.no_grad()
    def prefill(self, seqs: list[list[int]]) -> torch.Tensor:
        lens = [len(s) for s in seqs]
        cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
        ctx = ForwardContext(is_prefill=True,
                             slot_mapping=torch.tensor([self.slot(i, p) for i, n in enumerate(lens) for p in range(n)]),
                             state_slots=torch.tensor(self.state_slots), seq_lens=lens, cu_seqlens=cu)
        ids = torch.tensor([t for s in seqs for t in s])
        pos = torch.tensor([p for n in lens for p in range(n)])
        return self.model.compute_logits(self.model(ids, pos, ctx))

    @torch.no_grad()
    def decode(self, seqs: list[list[int]]) -> torch.Tensor:
        """One step for every sequence: its last token is the one being decoded."""
        n = torch.tensor([len(s) for s in seqs])
        tables = [[i * self.m + j for j in range(self.m)] for i in range(len(seqs))]
        ctx = ForwardContext(is_prefill=False,
                             slot_mapping=torch.tensor([self.slot(i, len(s) - 1) for i, s in enumerate(seqs)]),
                             state_slots=torch.tensor(self.state_slots),
                             block_tables=torch.tensor(tables, dtype=torch.int32),
                             context_lens=n.to(torch.int32), max_context_len=int(n.max()))
        ids = torch.tensor([s[-1] for s in seqs])
        return self.model.compute_logits(self.model(ids, n - 1, ctx))


# (the interpreter trips a numpy deprecation when it runs a loop with loaded bounds; not ours)
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
@pytest.mark.parametrize("prefill_kernels", [False, True], ids=["torch", "kernels"])
def test_prefill_and_decode_logits(pair, prefill_kernels, monkeypatch):
    """`kernels`: the delta rule's prefill through its Triton kernels (the interpreter on a CPU)."""
    hf, _, ours = pair
    if prefill_kernels:
        pytest.importorskip("triton_omni.kernels.gated_delta")
        monkeypatch.setattr(dispatch, "delta_rule_kernel", lambda device: True)
    seqs = prompts(seed=2)
    cache = ManualCache(ours, state_slots=[2, 0, 3, 1])     # deliberately not 0..B-1
    logits = cache.prefill(seqs)
    start = 0
    for s in seqs:
        ref = hf_logits(hf, s)
        torch.testing.assert_close(logits[start:start + len(s)], ref, atol=1e-4, rtol=1e-4)
        start += len(s)
    # decode steps against transformers' full (cache-free) forward of the grown sequences
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        for s in seqs:
            s.append(int(torch.randint(0, VOCAB, (1,), generator=gen)))
        logits = cache.decode(seqs)
        ref = torch.stack([hf_logits(hf, s)[-1] for s in seqs])
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
def test_prefill_graph_body_equals_eager_prefill(pair, monkeypatch):
    """What a prefill graph computes (the delta rule through its kernels: the interpreter on a CPU),
    run eagerly: the prompts in a 128-token bucket (34 padding tokens, 2 empty sequences whose state
    row is the scratch row) give the eager prefill's last hidden states, KV-cache rows and state rows,
    and change no other row."""
    pytest.importorskip("triton_omni.kernels.gated_delta")
    monkeypatch.setattr(dispatch, "delta_rule_kernel", lambda device: True)
    _, _, ours = pair
    engine = LLMEngine(ours, EngineConfig(max_num_seqs=6, max_model_len=128, cuda_graph_prefill_tokens=[16, 128]),
                       "cpu", torch.float32, eos_token_ids=[], vocab_size=VOCAB)
    seqs, runner = admitted_prompts(engine, prompts(seed=6)), engine.runner
    # the state rows but the scratch row (where the graph may put the empty sequences' conv windows)
    real = slice(0, runner.scratch)
    caches = [c for m, spec in runner.layers
              for c in ((m.k_cache, m.v_cache) if isinstance(spec, AttentionCacheSpec)
                        else (m.conv_state[real], m.ssm_state[real]))]
    eager, bucket, after_eager, stale = prefill_twice(runner, seqs, caches, lambda: runner.bucket_prefill_hidden(seqs, 128))
    torch.testing.assert_close(bucket, eager, atol=1e-5, rtol=1e-5)
    for c, e, s in zip(caches, after_eager, stale):
        assert not torch.equal(e, s)
        # the kernels (interpreted) and the torch path sum the delta rule in other orders: a state entry
        # once differed by 1.15e-5 (of 24,576); a stale or wrong row is off by O(1)
        torch.testing.assert_close(c, e, atol=5e-5, rtol=1e-5)


def test_greedy_generation_continuous_batching(pair):
    hf, _, ours = pair
    seqs = prompts(seed=4)[:3]
    engine = LLMEngine(ours, EngineConfig(max_num_seqs=4, max_model_len=128), "cpu", torch.float32,
                       eos_token_ids=[], vocab_size=VOCAB)
    outs = engine.generate(seqs, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    refs = [hf_greedy(hf, p, 24) for p in seqs]
    assert outs == refs
    assert engine.stats.max_decode_batch == 3
    assert all(len(set(o)) > 3 for o in outs), "degenerate outputs: the random weights are too weak"


def test_state_slot_reuse_mid_batch(pair):
    """With room for 2 sequences, the third request is admitted while the second is still decoding,
    into the slot the (shorter) first one just released."""
    hf, _, ours = pair
    a, b, c = prompts(seed=5)[:3]
    engine = LLMEngine(ours, EngineConfig(max_num_seqs=2, max_model_len=128), "cpu", torch.float32,
                       eos_token_ids=[], vocab_size=VOCAB)
    slots: dict[int, int] = {}

    def record(seq, new, reason):
        slots.setdefault(seq.seq_id, seq.state_slot)

    greedy = dict(temperature=0, ignore_eos=True)
    sa = engine.add(a, SamplingParams(max_tokens=6, **greedy), record)
    sb = engine.add(b, SamplingParams(max_tokens=20, **greedy), record)
    sc = engine.add(c, SamplingParams(max_tokens=12, **greedy), record)
    engine.run_until_done()
    assert slots[sc.seq_id] == slots[sa.seq_id] != slots[sb.seq_id]
    assert sa.output_ids == hf_greedy(hf, a, 6)
    assert sb.output_ids == hf_greedy(hf, b, 20)
    assert sc.output_ids == hf_greedy(hf, c, 12)


def test_multimodal_checkpoint_layout(pair, tmp_path):
    """A Qwen3_5ForConditionalGeneration-style folder: decoder under model.language_model.*, plus
    vision and MTP tensors that the text decoder does not use."""
    hf, _, _ = pair
    tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v.contiguous()
               for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.randn(24, 8)
    tensors["model.visual.merger.linear_fc2.weight"] = torch.randn(64, 32)
    tensors["mtp.fc.weight"] = torch.randn(64, 128)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = Qwen3_5Config(text_config=hf.config.to_dict(), vision_config={"depth": 1, "hidden_size": 8},
                           tie_word_embeddings=hf.config.tie_word_embeddings)
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3_5"

    ours = load_causal_lm(tmp_path, "cpu", torch.float32)
    seqs = prompts(seed=6)
    logits = ManualCache(ours, state_slots=[0, 1, 2, 3]).prefill(seqs)
    ends = torch.tensor([len(s) for s in seqs]).cumsum(0) - 1
    ref = torch.stack([hf_logits(hf, s)[-1] for s in seqs])
    torch.testing.assert_close(logits[ends], ref, atol=1e-4, rtol=1e-4)


def recurrent_delta_rule(q, k, v, g, beta):
    """The gated delta rule token by token (fp64): S_t = a_t S + k_t u_t^T, u_t = beta_t (v_t - a_t S^T k_t)."""
    state = torch.zeros(k.shape[1], k.shape[2], v.shape[2], dtype=torch.float64)
    out = []
    for t in range(q.shape[0]):
        state = g[t].exp()[:, None, None] * state
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", state, k[t]))
        state = state + k[t][:, :, None] * u[:, None, :]
        out.append(torch.einsum("hkv,hk->hv", state, q[t]))
    return torch.stack(out), state


@pytest.mark.parametrize("lens", [[150, 1, 64, 65, 7, 128, 150], [3], [64, 64]])
def test_chunked_delta_rule_equals_the_recurrence(lens):
    """Packed sequences of unequal lengths: some end while others run on (the scan's running set
    shrinks), chunks cut mid-sequence and at its end, a one-token sequence."""
    from triton_omni.kernels.gated_delta_reference import ChunkLayout, chunk_gated_delta_rule, l2norm

    gen = torch.Generator().manual_seed(0)
    T, H, dk, dv = sum(lens), 3, 16, 8
    q = l2norm(torch.randn(T, H, dk, generator=gen)) * dk ** -0.5
    k = l2norm(torch.randn(T, H, dk, generator=gen))
    v = torch.randn(T, H, dv, generator=gen)
    g = -0.5 * torch.rand(T, H, generator=gen)
    beta = torch.rand(T, H, generator=gen)
    layout = ChunkLayout.build(lens, 64, "cpu")
    assert layout.active[0] == len(lens) and sum(layout.active) * 64 == len(layout.gather)
    out, states = chunk_gated_delta_rule(q, k, v, g, beta, layout)
    start = 0
    for i, n in enumerate(lens):
        ref_out, ref_state = recurrent_delta_rule(*(x[start:start + n].double() for x in (q, k, v, g, beta)))
        torch.testing.assert_close(out[start:start + n].double(), ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[i].double(), ref_state, atol=1e-5, rtol=1e-5)
        start += n
