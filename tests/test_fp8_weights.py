"""FP8 weights through the models (models/quant.py): a tiny Qwen3 in the AR engine against the same
weights in fp32, an FP8 checkpoint in transformers' fine-grained layout, and a tiny Z-Image denoise.

The tiny checkpoints' random weights have rows of one magnitude, against which a scale applied to the
wrong row would hardly show; the weights here are spread first (rows and 32-column blocks scaled by
factors up to e^1.5 apart), so that the bounds below fail when scales are misapplied: the mutation
tests put wrong scales into the quantized models and check that the bounds then do fail.

Bounds (relative L2 error against fp32): the Qwen3's logits 0.25, with the prompts prefilled (the
activations quantized too, W8A8: measured 0.15 per channel, 0.13 per block) and in one-token forwards
(weights alone: 0.07, 0.09); Z-Image's final latents 0.05 (measured 0.028). Misapplied scales give
1.1-1.4 (logits) and 0.31 (latents).
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.sampling import SamplingParams
from triton_omni.kernels import fp8_matmul_reference as fp8
from triton_omni.models import quant
from triton_omni.models.registry import load_causal_lm

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42], [100 + i for i in range(20)]]
LOGITS_BOUND = 0.25
LATENTS_BOUND = 0.05
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def folder(tiny_checkpoints, tmp_path_factory):
    """The tiny Qwen3 with its projections' rows and column blocks spread in magnitude."""
    src = tiny_checkpoints["qwen3"]
    dst = tmp_path_factory.mktemp("fp8") / "qwen3_spread"
    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(0)
    sd = load_file(str(src / "model.safetensors"))
    for name, w in sd.items():
        if name.rsplit(".", 2)[-2] in PROJ:
            rows = torch.exp(3 * (torch.rand(w.shape[0], 1, generator=g) - 0.5))
            cols = torch.exp(2 * (torch.rand(1, -(-w.shape[1] // 32), generator=g) - 0.5)).repeat_interleave(32, 1)
            sd[name] = (w * rows * cols[:, :w.shape[1]]).contiguous()
    save_file(sd, str(dst / "model.safetensors"))
    return dst


def engine_of(model, **config) -> LLMEngine:
    p = next(model.parameters())
    dtype = torch.float32 if p.device.type == "cpu" else torch.bfloat16
    return LLMEngine(model, EngineConfig(**{"max_num_seqs": 4, "max_model_len": 64, **config}), p.device, dtype, [],
                     model.config.vocab_size)


def logits(model) -> tuple[torch.Tensor, torch.Tensor]:
    """(every prompt token's logits, the prompts prefilled together; each prompt's first token alone,
    a one-row forward as a batch-1 decode step runs it)."""
    def prefill(prompts):
        engine = engine_of(model)
        for p in prompts:
            engine.add(p, SamplingParams(max_tokens=1))
        engine._drain_inbox()
        with torch.inference_mode():
            return engine.runner.prefill_logits(engine.scheduler.schedule().seqs, all_tokens=True)
    return prefill(PROMPTS), torch.cat([prefill([p[:1]]) for p in PROMPTS])


@pytest.fixture(scope="module")
def exact(folder):
    return logits(load_causal_lm(folder, "cpu", torch.float32))


@pytest.mark.parametrize("scheme", ["fp8", "fp8_block"])
def test_fp8_logits_stay_near_full_precision(folder, exact, scheme):
    model = load_causal_lm(folder, "cpu", torch.float32, quantization=scheme)
    layers = [m for m in model.modules() if isinstance(m, quant.Fp8Linear)]
    assert len(layers) == 4 * model.config.num_hidden_layers                 # qkv, o, gate_up, down
    blocks = lambda m: (-(-m.out_features // 128), -(-m.in_features // 128))      # noqa: E731
    assert all(m.weight.dtype == fp8.FP8 and m.weight_scale_inv.shape == (
        (m.out_features,) if scheme == "fp8" else blocks(m)) for m in layers)
    prompts, firsts = logits(model)
    assert rel(prompts, exact[0]) < LOGITS_BOUND and rel(firsts, exact[1]) < LOGITS_BOUND
    assert (prompts.argmax(-1) == exact[0].argmax(-1)).float().mean() > 0.8


def test_fp8_lm_head_is_a_copy_beside_the_tied_embedding(folder, exact):
    model = load_causal_lm(folder, "cpu", torch.float32, quantization="fp8", lm_head=True)
    assert isinstance(model.lm_head, quant.Fp8Linear) and model.model.embed_tokens.weight.dtype == torch.float32
    assert rel(logits(model)[0], exact[0]) < LOGITS_BOUND


MUTATIONS = {
    "missing": lambda s: torch.ones_like(s),
    "another row's": lambda s: s.roll(1, 0),
    "another column block's": lambda s: s.flip(1),
}


@pytest.mark.parametrize("scheme,mutation", [("fp8", "missing"), ("fp8", "another row's"),
                                             ("fp8_block", "another row's"), ("fp8_block", "another column block's")])
def test_misapplied_scales_break_the_bound(folder, exact, scheme, mutation):
    model = load_causal_lm(folder, "cpu", torch.float32, quantization="fp8_block" if scheme == "fp8_block" else "fp8")
    if scheme == "fp8_block":       # blocks of 16 x 32: several per weight, so rows and columns can be swapped
        for m in model.modules():
            if isinstance(m, quant.Fp8Linear):
                m.set_weight(m.dequantized(), (16, 32))
    for m in model.modules():
        if isinstance(m, quant.Fp8Linear):
            m.weight_scale_inv.data = MUTATIONS[mutation](m.weight_scale_inv.data).contiguous()
    prompts, firsts = logits(model)
    assert rel(prompts, exact[0]) > 2 * LOGITS_BOUND and rel(firsts, exact[1]) > 2 * LOGITS_BOUND


def test_fp8_engine_generates(folder):
    model = load_causal_lm(folder, "cpu", torch.float32, quantization="fp8")
    prompts, _ = logits(model)
    outs = engine_of(model).generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    ends = torch.tensor([len(p) for p in PROMPTS]).cumsum(0) - 1
    assert [o[0] for o in outs] == prompts[ends].argmax(-1).tolist()        # the prefill's greedy token first
    assert all(len(o) == 6 for o in outs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs, the skinny FP8 kernel and torch._scaled_mm")
@pytest.mark.parametrize("scheme", ["fp8", "fp8_block"])
def test_fp8_on_the_gpu_decodes_in_cuda_graphs_as_eagerly(folder, scheme):
    """bf16 activations: the logits within the bound of bf16 weights' (prefill through torch._scaled_mm,
    one row through the skinny FP8 kernel); the decode steps replayed from CUDA graphs give the tokens
    the eager steps give, for one sequence (the skinny kernels) and for eight (torch._scaled_mm; eight
    fill the graph's bucket, so both run the same matmul shapes)."""
    from triton_omni.kernels import dispatch

    dispatch.enable(True)
    bf16 = load_causal_lm(folder, "cuda", torch.bfloat16)
    model = load_causal_lm(folder, "cuda", torch.bfloat16, quantization=scheme)
    for got, want in zip(logits(model), logits(bf16)):
        assert rel(got, want) < LOGITS_BOUND
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [[3 + i, 40 + 2 * i, 7] for i in range(8)]
    for batch in (prompts[:1], prompts):
        eager = engine_of(model, max_num_seqs=8, enforce_eager=True).generate(batch, greedy)
        graphs = engine_of(model, max_num_seqs=8, cuda_graph_batch_sizes=[1, 8])
        assert graphs.runner.use_graphs
        assert graphs.generate(batch, greedy) == eager


# --- a checkpoint already in FP8 ------------------------------------------------------------------------
BLOCK = (16, 32)


def write_fp8_checkpoint(src, dst):
    """transformers' fine-grained FP8 layout: each projection's float8_e4m3fn `weight` beside its float32
    `weight_scale_inv` [ceil(N / 16), ceil(K / 32)], and quantization_config in config.json."""
    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    out = {}
    for name, w in sd.items():
        if name.rsplit(".", 2)[-2] in PROJ:
            out[name], out[name + "_scale_inv"] = fp8.quantize_weight(w, BLOCK)
        else:
            out[name] = w
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": list(BLOCK)}
    (dst / "config.json").write_text(json.dumps(config))
    return out


def blockwise(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q * s, each element times the scale of its (row // 16, column // 32) block: the layout, from its definition."""
    rows, cols = torch.arange(q.shape[0])[:, None] // BLOCK[0], torch.arange(q.shape[1])[None, :] // BLOCK[1]
    return q.float() * s[rows, cols]


@pytest.mark.parity
def test_an_fp8_checkpoint_loads_as_transformers_reads_it(folder, exact, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from triton_omni.converters.verify import check_chat

    ckpt = tmp_path / "qwen3_fp8"
    tensors = write_fp8_checkpoint(folder, ckpt)
    report = []
    check_chat(ckpt, report)                  # the converter's check reads it too
    assert report == []
    # without quantization: dequantized at load, the weights transformers' Qwen3 gets from them
    plain = load_causal_lm(ckpt, "cpu", torch.float32)
    dequantized = {n: blockwise(t, tensors[n + "_scale_inv"]) if t.dtype == fp8.FP8 else t
                   for n, t in tensors.items() if not n.endswith("_scale_inv")}
    layer = plain.model.layers[1]
    assert torch.equal(layer.self_attn.qkv_proj.weight[64:96], dequantized["model.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(layer.mlp.down_proj.weight, dequantized["model.layers.1.mlp.down_proj.weight"])
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder))).eval()
    hf.load_state_dict(dequantized, strict=False)
    hf.tie_weights()
    ours = logits(plain)[0]
    with torch.no_grad():
        ref = torch.cat([hf(torch.tensor([p])).logits[0] for p in PROMPTS])
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    # with quantization: the checkpoint's own values and block scales, as they are
    model = load_causal_lm(ckpt, "cpu", torch.float32, quantization="fp8")
    qkv = model.model.layers[1].self_attn.qkv_proj
    assert isinstance(qkv, quant.Fp8MergedLinear) and qkv.block == BLOCK
    k_rows = slice(64 // BLOCK[0], 96 // BLOCK[0])
    assert torch.equal(qkv.weight[64:96].view(torch.uint8),
                       tensors["model.layers.1.self_attn.k_proj.weight"].view(torch.uint8))
    assert torch.equal(qkv.weight_scale_inv[k_rows], tensors["model.layers.1.self_attn.k_proj.weight_scale_inv"])
    assert rel(logits(model)[0], exact[0]) < LOGITS_BOUND


def test_quantization_parameters_are_checked(folder, tmp_path):
    with pytest.raises(ValueError, match="parameter 'quantization': expected one of"):
        load_causal_lm(folder, "cpu", torch.float32, quantization="int4")
    with pytest.raises(ValueError, match="parameter 'quantize_lm_head'"):
        load_causal_lm(folder, "cpu", torch.float32, lm_head=True)
    other = tmp_path / "awq"
    shutil.copytree(folder, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "awq"}}))
    with pytest.raises(ValueError, match="'awq'.* is not supported"):
        load_causal_lm(other, "cpu", torch.float32)


# --- a diffusion transformer ----------------------------------------------------------------------------
def spread_(linear: torch.nn.Linear, g: torch.Generator) -> None:
    w = linear.weight.data
    rows = torch.exp(3 * (torch.rand(w.shape[0], 1, generator=g) - 0.5))
    cols = torch.exp(2 * (torch.rand(1, -(-w.shape[1] // 32), generator=g) - 0.5)).repeat_interleave(32, 1)
    w.mul_(rows * cols[:, :w.shape[1]])


def test_z_image_denoise_with_fp8_blocks_stays_near_full_precision(tiny_checkpoints):
    """The step's `quantization: fp8` swaps the blocks' linears (not the modulation's); the final latents
    of a denoise run with spread weights stay within the bound of the same run unquantized, and leave
    it with each row's scale on another row."""
    from tests.test_image_steps import ROOT, load_steps, request, run_chain
    from triton_omni.converters.schema import load_ensemble
    from triton_omni.runtime.params import parse_params
    from triton_omni.runtime.step import StepContext

    steps = load_steps("z_image_turbo")
    cfg = load_ensemble(ROOT / "ensemble_configs" / "z_image_turbo.yaml")
    spec = next(s for s in cfg.steps if s.key == "denoise")
    raw = dict(cfg.resolved_parameters(spec, "cpu"), quantization="fp8")
    step = spec.cls(StepContext(model_name="z_image_turbo_denoise", params=parse_params(spec.cls.Params, raw),
                                device="cpu", base_dir=ROOT, max_batch_size=cfg.max_batch_size))
    swapped = [n for n, m in step.transformer.named_modules() if isinstance(m, quant.Fp8Linear)]
    assert len(swapped) == 7 * 4 and not any("modulation" in n for n in swapped)   # 4 blocks: q, k, v, out, w1-3
    # the same run on one transformer: spread, unquantized; then quantized in place; then its scales rolled
    denoise, g = steps[2], torch.Generator().manual_seed(1)
    for name in swapped:
        spread_(denoise.transformer.get_submodule(name), g)
    embedded = run_chain(steps[:2], [request("a red cat", size="32x32", num_inference_steps=2, guidance_scale=2.0,
                                             seed=7)])

    def latents():
        return torch.from_numpy(run_chain([denoise], [dict(t) for t in embedded])[0]["latents"])

    want = latents()
    assert quant.quantize_blocks(denoise.transformer, "fp8") == swapped
    assert rel(latents(), want) < LATENTS_BOUND
    for name in swapped:
        m = denoise.transformer.get_submodule(name)
        m.weight_scale_inv.data = m.weight_scale_inv.data.roll(1, 0)
    assert rel(latents(), want) > 4 * LATENTS_BOUND
