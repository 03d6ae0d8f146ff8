"""Video generation benchmark: our Wan2.2 steps in-process (the classes the ensembles run) against
diffusers' WanPipeline, eager and with torch.compile, on the released shapes with random bf16 weights,
in one run on one GPU.

    python -m perf_analyzer_configs.benchmarks.bench_video                # on the GPU machine (both parts)
    python -m perf_analyzer_configs.benchmarks.bench_video --part 1 --out /tmp/v1.json   # TI2V-5B 1280x704x121
    python -m perf_analyzer_configs.benchmarks.bench_video --part 2 --out /tmp/v2.json   # 832x480x81, A14B
    python -m perf_analyzer_configs.benchmarks.bench_video --merge /tmp/v1.json /tmp/v2.json
    python -m perf_analyzer_configs.benchmarks.bench_video --dry-run      # parameter and FLOP counts (no weights)
    python -m perf_analyzer_configs.benchmarks.bench_video --shapes tiny --out /tmp/video_tiny.json   # the CPU check

TI2V-5B (text to video), at the release setting (1280x704, 121 frames) and at 832x480, 81 frames:
time per denoise step (both CFG branches), VAE decode, MP4 encode (ours), and end to end over a
reduced step count (`--steps`; a real request takes 50); T2V-A14B at 832x480x81: one step on each
expert (both resident). Peak GPU memory per row. Weights are built on the device from the configs below
(no download) and shared by every mode. The MP4 encode needs PyAV (`av`); without it that column stays
empty. Writes perf_analyzer_configs/results/video.json and its pages.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import diffusers
import numpy as np
import torch
import transformers

import triton_omni.diffusion.text_encoder
import triton_omni.video.vae
import triton_omni.video.wan.denoise
from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks.ar_checkpoints import SPECIALS
from perf_analyzer_configs.benchmarks.bench_image import matmul_tflops, seconds, stamp
from perf_analyzer_configs.benchmarks.common import ROOT, device_name, release_memory, versions
from triton_omni.converters.schema import load_ensemble
from triton_omni.converters.tiny_common import synthetic_tokenizer
from triton_omni.runtime.params import parse_params
from triton_omni.runtime.step import Request, ResponseSink, StepContext

# google/umt5-xxl's encoder (text_encoder/config.json of the Wan2.2 Diffusers repos)
UMT5_XXL = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
                tie_word_embeddings=False, layer_norm_epsilon=1e-6, pad_token_id=0, eos_token_id=1)
WAN = dict(patch_size=[1, 2, 2], attention_head_dim=128, cross_attn_norm=True, eps=1e-6, freq_dim=256,
           qk_norm="rms_norm_across_heads", text_dim=4096, rope_max_seq_len=1024)
# diffusers' scripts/convert_wan_to_diffusers.py: the Wan2.2 VAE (TI2V-5B) and the Wan2.1 VAE (A14B: defaults)
VAE22 = dict(base_dim=160, z_dim=48, is_residual=True, in_channels=12, out_channels=12, decoder_base_dim=256,
             scale_factor_temporal=4, scale_factor_spatial=16, patch_size=2, latents_mean=[
                 -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
                 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
                 -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
                 -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667],
             latents_std=[
                 0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
                 0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
                 0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
                 0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744])
MODELS = {
    "ti2v_5b": dict(yaml="wan2_2_ti2v", index={"expand_timesteps": True, "boundary_ratio": None}, flow_shift=5.0,
                    transformer=dict(WAN, num_attention_heads=24, num_layers=30, ffn_dim=14336, in_channels=48,
                                     out_channels=48), vae=VAE22, experts=1, guidance=5.0),
    "t2v_a14b": dict(yaml="wan2_2_t2v_a14b", index={"boundary_ratio": 0.875}, flow_shift=3.0,
                     transformer=dict(WAN, num_attention_heads=40, num_layers=40, ffn_dim=13824, in_channels=16,
                                      out_channels=16), vae={}, experts=2, guidance=4.0),
}
TINY = {   # converters/tiny_video.py's shapes: the same structure, seconds on a CPU
    "transformer": dict(num_attention_heads=2, attention_head_dim=12, num_layers=2, ffn_dim=32, freq_dim=32,
                        text_dim=32, rope_max_seq_len=32),
    "ti2v_5b": dict(base_dim=4, decoder_base_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1),
    "t2v_a14b": dict(base_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1),
    "text_encoder": dict(vocab_size=2048, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                         relative_attention_num_buckets=8, relative_attention_max_distance=32),
}
PARTS = {   # (model, "WxHxF") runs; each part fits in a few minutes
    "real": {1: [("ti2v_5b", "1280x704x121")], 2: [("ti2v_5b", "832x480x81"), ("t2v_a14b", "832x480x81")]},
    "tiny": {1: [("ti2v_5b", "64x32x9")], 2: [("ti2v_5b", "32x32x5"), ("t2v_a14b", "32x32x9")]},
}
MODE_ORDER = ["diffusers", "diffusers-compile", "ours", "ours-compile"]   # ours sets its attention kernel in place
PROMPT_CHARS = 120
FLOPS_NOTE = ("Denoise FLOPs per clip row and transformer call = 2·(6d² + 2·d·f)·T·N + 2·2d²·L·N + "
              "4d·(T² + T·L)·N: d model width, f FFN width, T video tokens (frames/4+1 x h/p x w/p latent "
              "patches), L = 512 text tokens, N blocks (q, k, v, o of self-attention, q, o of cross-attention on "
              "the video tokens, k, v on the text, the "
              "two FFN matmuls; self- and cross-attention scores and values); patch embedding, time embedding and "
              "the output projection left out. TFLOP/s = that x rows / median call time (CUDA events around the "
              "transformer call); % = against the matmul rate measured in the same run.")


def spec_for(name: str, shapes: str) -> dict:
    spec = copy.deepcopy(MODELS[name])
    spec["text_encoder"] = dict(UMT5_XXL)
    if shapes == "tiny":
        spec["transformer"].update(TINY["transformer"])
        spec["vae"].update(TINY[name])
        spec["text_encoder"].update(TINY["text_encoder"])
    return spec


def cast(model, dtype):
    """`model` in `dtype`, except the parameters diffusers keeps in float32 when it loads a checkpoint in
    `dtype` (`_keep_in_fp32_modules`: the Wan transformer's norms, time embedder, rotary table)."""
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, p in model.named_parameters():
        p.data = p.data.to(torch.float32 if any(k in name for k in keep) else dtype)
    return model.eval()


def build_components(spec: dict, device, dtype) -> dict:
    torch.manual_seed(0)
    out = {}
    with torch.device(device):
        for key in ["transformer", "transformer_2"][:spec["experts"]]:
            out[key] = cast(diffusers.WanTransformer3DModel.from_config(spec["transformer"]), dtype)
        out["vae"] = cast(diffusers.AutoencoderKLWan.from_config(spec["vae"]), dtype)
        config = transformers.UMT5Config(**spec["text_encoder"])
        out["text_encoder"] = transformers.UMT5EncoderModel(config).to(dtype).eval()
    return out


def write_folder(spec: dict, components: dict, folder: Path):
    """A diffusers pipeline folder of the components' whole configs and a tokenizer of the encoder's
    vocabulary size; no weights (the steps get the modules already built)."""
    index = {"_class_name": "WanPipeline", "_diffusers_version": diffusers.__version__, **spec["index"],
             "scheduler": ["diffusers", "UniPCMultistepScheduler"],
             "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
             "text_encoder": ["transformers", "UMT5EncoderModel"], "vae": ["diffusers", "AutoencoderKLWan"],
             "transformer": ["diffusers", "WanTransformer3DModel"],
             "transformer_2": ["diffusers", "WanTransformer3DModel"] if spec["experts"] == 2 else [None, None]}
    for key, module in components.items():
        if key == "text_encoder":
            module.config.save_pretrained(str(folder / key))
        else:
            module.save_config(str(folder / key))
    scheduler = diffusers.UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                  num_train_timesteps=1000, flow_shift=spec["flow_shift"])
    scheduler.save_pretrained(str(folder / "scheduler"))
    vocab = spec["text_encoder"]["vocab_size"]
    synthetic_tokenizer(folder / "tokenizer", vocab, {s: vocab - 8 + i for i, s in enumerate(SPECIALS)})
    (folder / "model_index.json").write_text(json.dumps(index, indent=1))
    return folder, scheduler


def tokens(spec: dict, width: int, height: int, frames: int) -> int:
    scale = spec["vae"].get("scale_factor_spatial", 8) * spec["transformer"]["patch_size"][1]
    return ((frames - 1) // 4 + 1) * (height // scale) * (width // scale)


def wan_flops(cfg: dict, t: int, text: int = 512) -> float:
    """One clip row's transformer call (formula: FLOPS_NOTE)."""
    d, f, n = cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["ffn_dim"], cfg["num_layers"]
    return n * (2 * (6 * d * d + 2 * d * f) * t + 2 * 2 * d * d * text + 4 * d * (t * t + t * text))


@contextlib.contextmanager
def call_timer(modules: list, cuda: bool):
    """Yields a list that gets [start, end, rows, expert] for every call of each module in `modules`."""
    calls, hooks = [], []
    for i, m in enumerate(modules):
        def pre(mod, args, kwargs, i=i):
            x = kwargs.get("hidden_states", args[0] if args else None)
            calls.append([stamp(cuda), None, x.shape[0], i])

        def post(mod, args, out):
            calls[-1][1] = stamp(cuda)
        hooks += [m.register_forward_pre_hook(pre, with_kwargs=True), m.register_forward_hook(post)]
    try:
        yield calls
    finally:
        for h in hooks:
            h.remove()


def prompt(i: int) -> str:
    rng = random.Random(i)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(PROMPT_CHARS))


class Sink(ResponseSink):
    def __init__(self):
        self.out, self.err, self.done = None, None, threading.Event()

    def send(self, outputs, final=False):
        if final:
            self.out = outputs
            self.done.set()

    def error(self, exc):
        self.err = exc
        self.done.set()


def build_steps(ctx, compiled: bool) -> dict:
    """The ensemble's steps with its GPU parameters; they take the modules already built (a VAE step
    keeps half of its VAE: each gets a copy). `compiled`: the denoise step's `compile` parameter."""
    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{ctx.spec['yaml']}.yaml")
    modules = (triton_omni.diffusion.text_encoder, triton_omni.video.vae, triton_omni.video.wan.denoise)
    saved = [m.load_component for m in modules]
    own = lambda folder, name, dtype="float32", device="cpu": (copy.deepcopy(ctx.components[name])  # noqa: E731
                                                              if name == "vae" else ctx.components[name])
    for m in modules:
        m.load_component = own
    try:
        steps = {}
        for s in cfg.steps:
            raw = cfg.resolved_parameters(s, "gpu" if ctx.cuda else "cpu")
            raw.update({"checkpoint": str(ctx.folder)} if "checkpoint" in raw else {})
            raw.update({"compile": "true"} if compiled and s.key == "denoise" else {})
            raw.update({"max_steps": "1000", "max_frames": "121", "max_side": "1280", "max_pixels": "921600"}
                       if "max_steps" in raw else {})
            raw.update({"channels_last": "true"} if ctx.args.vae_channels_last and "channels_last" in raw else {})
            sctx = StepContext(model_name=cfg.model_name(s), params=parse_params(s.cls.Params, raw), base_dir=ROOT,
                               device=ctx.device if s.kind == "gpu" else "cpu", max_batch_size=cfg.max_batch_size)
            steps[s.key] = s.cls(sctx)
        return steps
    finally:
        for m, f in zip(modules, saved):
            m.load_component = f


def run_step(step, tensors: dict) -> None:
    names = {t.name for t in step.inputs}
    req = Request({k: v for k, v in tensors.items() if k in names}, request_id="bench")
    if step.decoupled:
        sink = Sink()
        step.submit(req, sink)
        assert sink.done.wait(3600), "denoise did not finish"
        if sink.err is not None:
            raise sink.err
        out = sink.out
    else:
        [out] = step.execute([req])
        if isinstance(out, BaseException):
            raise out
    tensors.update(out)


def ours(ctx, size, steps: int, compiled: bool):
    key = "steps_compiled" if compiled else "steps_eager"
    ctx.built[key] = ctx.built.get(key) or build_steps(ctx, compiled)
    st = ctx.built[key]
    w, h, f = size

    def go():
        x = {"prompt": np.array([prompt(0).encode()], dtype=object), "width": np.array([w], np.int32),
             "height": np.array([h], np.int32), "num_frames": np.array([f], np.int32),
             "num_inference_steps": np.array([steps], np.int32), "seed": np.array([1000], np.int64),
             "guidance_scale": np.array([ctx.spec["guidance"]], np.float32)}
        stages, t0 = {}, time.perf_counter()
        for k in [k for k in ("pre", "text_encoder", "vae_encode", "denoise", "vae_decode") if k in st]:
            if k == "vae_decode" and ctx.latents_only:
                break
            t = time.perf_counter()
            run_step(st[k], x)
            ctx.sync()
            stages[k] = time.perf_counter() - t
        frames = x.get("frames")
        frames = frames.cpu().numpy() if isinstance(frames, torch.Tensor) else frames
        wall = time.perf_counter() - t0
        if frames is not None and ctx.has_av:
            t = time.perf_counter()
            run_step(st["encode"], {"frames": frames, "fps": np.array([24], np.int32)})
            stages["mp4_encode"] = time.perf_counter() - t          # apart: the pipeline does not encode
        return wall, frames, stages

    return go, st["denoise"].transformers()


def diffusers_mode(ctx, size, steps: int, compiled: bool):
    if ctx.pipe is None:
        from diffusers import WanPipeline

        from triton_omni.diffusion.checkpoint import load_tokenizer

        ctx.pipe = WanPipeline(tokenizer=load_tokenizer(ctx.folder), scheduler=ctx.scheduler,
                               text_encoder=ctx.components["text_encoder"], vae=ctx.components["vae"],
                               transformer=ctx.components["transformer"],
                               transformer_2=ctx.components.get("transformer_2"), **ctx.spec["index"])
        ctx.pipe.set_progress_bar_config(disable=True)
    pipe, w, h, f = ctx.pipe, *size
    if compiled and ctx.compiled is None:
        ctx.compiled = [torch.compile(ctx.components[k], mode=ctx.args.compile_mode, dynamic=False)
                        for k in ["transformer", "transformer_2"][:ctx.spec["experts"]]]
    models = ctx.compiled if compiled else [ctx.components[k]
                                            for k in ["transformer", "transformer_2"][:ctx.spec["experts"]]]
    pipe.transformer, pipe.transformer_2 = models[0], (models[1] if len(models) > 1 else None)

    def go():
        t0 = time.perf_counter()
        out = pipe(prompt=prompt(0), height=h, width=w, num_frames=f, num_inference_steps=steps,
                   guidance_scale=ctx.spec["guidance"], generator=torch.Generator().manual_seed(1000),
                   output_type="latent" if ctx.latents_only else "np").frames
        ctx.sync()
        wall = time.perf_counter() - t0          # the pipeline's own float frames on the host, as it returns them
        return wall, None if ctx.latents_only else (out[0] * 255).round().astype(np.uint8), {}

    # the timing hooks go on what the pipeline calls: on torch.compile's wrapper they stay outside the
    # compiled graph (hooks on the module inside it would change what it guards on and recompile it)
    return go, models


def measure(ctx, mode: str, size, steps: int) -> dict:
    compiled = mode.endswith("compile")
    go, modules = (ours if mode.startswith("ours") else diffusers_mode)(ctx, size, steps, compiled)
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    go()                                            # warm-up (a compiled mode compiles this shape)
    warm_s = time.perf_counter() - t
    walls, stage_runs, calls = [], [], []
    for _ in range(ctx.args.repeats):
        with call_timer(modules, ctx.cuda) as timed:
            wall, frames, stages = go()
        ctx.sync()
        walls.append(wall)
        stage_runs.append(stages)
        calls += [(seconds(s, e, ctx.cuda), rows, expert) for s, e, rows, expert in timed]
    w, h, f = size
    t = tokens(ctx.spec, w, h, f)
    row = {"model": ctx.name, "size": f"{w}x{h}x{f}", "mode": mode, "steps": steps, "repeats": ctx.args.repeats,
           "e2e_ms": 1e3 * statistics.median(walls), "tokens": t}
    per_step = sum(c[0] for c in calls) / (ctx.args.repeats * steps)
    row["step_ms"] = 1e3 * per_step                 # both CFG branches (one call ours, two diffusers')
    row["call_ms"] = 1e3 * statistics.median(c[0] for c in calls)
    row["call_rows"] = max(c[1] for c in calls)
    flops = wan_flops(ctx.spec["transformer"], t)
    row["denoise_tflops"] = statistics.median(c[1] * flops / c[0] for c in calls) / 1e12
    row["matmul_share"] = row["denoise_tflops"] / ctx.matmul
    if ctx.spec["experts"] == 2:
        row["expert_step_ms"] = [1e3 * sum(c[0] for c in calls if c[2] == e) / ctx.args.repeats for e in (0, 1)]
    if stage_runs[0]:
        row["stages_ms"] = {k: 1e3 * statistics.median(s[k] for s in stage_runs) for k in stage_runs[0]}
    if compiled:
        row["first_call_s"] = warm_s
    if ctx.cuda:
        row["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 2**30
    if frames is not None:
        ref = ctx.reference.setdefault(row["size"], (mode, frames))
        row.update(max_abs_diff_px=int(np.abs(frames.astype(int) - ref[1].astype(int)).max()), diff_against=ref[0])
    return row


# --- results ------------------------------------------------------------------------------------
def targets(rows) -> list[str]:
    by = {(r["model"], r["size"], r["mode"]): r for r in rows}
    out = []
    for model, size in dict.fromkeys((r["model"], r["size"]) for r in rows):
        for mine_mode in ("ours", "ours-compile"):
            mine = by.get((model, size, mine_mode))
            for other, goal in (("diffusers", 1.5), ("diffusers-compile", 1.15)):
                theirs = by.get((model, size, other))
                if mine and theirs and model == "ti2v_5b":
                    x = theirs["e2e_ms"] / mine["e2e_ms"]
                    out.append(f"{model} {size}: e2e ({mine['steps']} steps) {mine_mode} {mine['e2e_ms']:.0f} ms vs "
                               f"{other} {theirs['e2e_ms']:.0f} ms = {x:.2f}x (target >= {goal}x): "
                               f"{'PASS' if x >= goal else 'FAIL'}")
            if mine:
                out.append(f"{model} {size}: {mine_mode} denoise {mine['denoise_tflops']:.3g} TFLOP/s = "
                           f"{100 * mine['matmul_share']:.0f}% of the matmul rate (target >= 75%): "
                           f"{'PASS' if mine['matmul_share'] >= 0.75 else 'FAIL'}")
                if "peak_gpu_gb" in mine and model == "t2v_a14b":
                    out.append(f"{model} {size}: {mine_mode} peak GPU memory {mine['peak_gpu_gb']:.1f} GiB "
                               f"(fits one 141 GB GPU: {'PASS' if mine['peak_gpu_gb'] < 131 else 'FAIL'})")
    return out


def write_results(rows, path: Path, matmul: float, gpu=None, run_versions=None, date=None, notes=()):
    meta = {"gpu": gpu or device_name(), "versions": run_versions or versions("diffusers", "transformers", "av"),
            "matmul_tflops": matmul, "flops_formula": FLOPS_NOTE, "targets": targets(rows)}
    results.write(path, PAGE, rows, meta, notes, date)


def intro(data) -> list[str]:
    return ["Random bf16 weights in the released configs (UMT5-XXL text encoder, the Wan2.2 / Wan2.1 VAEs), one clip "
            f"per request, a {PROMPT_CHARS}-token prompt, CFG on (guidance 5 TI2V, 4 A14B): both branches each step. "
            "e2e: request in -> uint8 frames on the host (A14B: latents), over `steps` steps (a real request takes "
            "40-50: the per-step column scales it); ours' stages (pre + text encoder, denoise, VAE decode) and the MP4 "
            "encode (apart: the pipeline does not encode) in stages_ms. step ms: CUDA-event time of the transformer "
            "calls of one step. Medians over the repeats, after a warm-up run. Matmul rate in this run (bf16 8192³; "
            f"a CPU check: fp32 1024³): {data['matmul_tflops']:.3g} TFLOP/s.", "", data["flops_formula"]]


def after(rows, data) -> list[str]:
    return ["Δpx: max |pixel difference| of the frames against the first mode of the run at that size (same weights, "
            "prompt and seed): a sanity check. first call s: the warm-up run of a compiled mode (compiles + one run).",
            "", "Targets:", "", *[f"- {t}" for t in data["targets"]]]


def stage(key):
    return lambda r: f"{r['stages_ms'][key]:.0f}" if key in r.get("stages_ms", {}) else ""


PAGE = results.Page(
    title="Video generation benchmark", module="perf_analyzer_configs.benchmarks.bench_video", intro=intro, after=after,
    columns=[results.column("model", "model", numeric=False), results.column("size WxHxF", "size", numeric=False),
             results.column("mode", "mode", numeric=False), results.column("steps", "steps"),
             results.column("e2e ms", "e2e_ms", ".0f"), results.column("step ms", "step_ms", ".0f"),
             results.Column("A14B experts ms/step",
                            lambda r: " / ".join(f"{v:.0f}" for v in r.get("expert_step_ms", []))),
             results.column("TFLOP/s", "denoise_tflops", ".3g"),
             results.Column("% matmul", lambda r: f"{100 * r['matmul_share']:.0f}%" if "matmul_share" in r else ""),
             results.Column("text ms", lambda r: "" if "stages_ms" not in r else
                            f"{r['stages_ms'].get('pre', 0) + r['stages_ms'].get('text_encoder', 0):.0f}"),
             results.Column("VAE decode ms", stage("vae_decode")), results.Column("MP4 ms", stage("mp4_encode")),
             results.column("peak GiB", "peak_gpu_gb", ".1f"), results.column("Δpx", "max_abs_diff_px"),
             results.column("first call s", "first_call_s", ".0f")],
    order=lambda r: (list(MODELS).index(r["model"]), -int(r["size"].split("x")[0]), MODE_ORDER.index(r["mode"])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, choices=[1, 2], help="one part of the run (default: both)")
    ap.add_argument("--modes", nargs="+", default=list(MODE_ORDER), choices=MODE_ORDER)
    ap.add_argument("--shapes", default="real", choices=["real", "tiny"],
                    help="tiny: seconds on a CPU, to check the script")
    ap.add_argument("--steps", type=int, default=4,
                    help="denoise steps of the end-to-end runs (TI2V; A14B: 2, one on each expert)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per row, after a warm-up run")
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode of diffusers-compile")
    ap.add_argument("--vae-channels-last", action="store_true", help="our VAE steps in channels-last-3d")
    ap.add_argument("--workdir", default="/tmp/triton-omni-bench-video")
    ap.add_argument("--out", type=Path, default=results.RESULTS / "video.json")
    ap.add_argument("--dry-run", action="store_true", help="print parameter and FLOP counts (meta device), then stop")
    ap.add_argument("--merge", nargs="+", type=Path, help="combine the results of separate runs into --out")
    ap.add_argument("--note", action="append", default=[], help="a note for the results")
    args = ap.parse_args()
    diffusers.utils.logging.set_verbosity_error()
    runs = [r for p, rs in PARTS[args.shapes].items() if args.part in (None, p) for r in rs]
    if args.dry_run:
        for name in dict.fromkeys(n for n, _ in runs):
            spec = spec_for(name, args.shapes)
            counts = {k: sum(p.numel() for p in m.parameters())
                      for k, m in build_components(spec, "meta", torch.bfloat16).items()}
            print(f"{name}: " + ", ".join(f"{k} {n / 1e9:.3f}B params" for k, n in counts.items()))
            for _, size in [r for r in runs if r[0] == name]:
                w, h, f = map(int, size.split("x"))
                t = tokens(spec, w, h, f)
                print(f"  {size}: {t} video tokens: {wan_flops(spec['transformer'], t) / 1e12:.1f} TFLOP per "
                      "clip row and call")
        return 0
    if args.merge:
        parts, rows, notes = results.merge_parts(args.merge, ("model", "size", "mode"), args.note)
        write_results(rows, args.out, parts[0]["matmul_tflops"], parts[0]["gpu"], parts[0]["versions"],
                      max(p["date"] for p in parts), notes)
        print(args.out.with_suffix(".md").read_text())
        return 0
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)   # a CPU check shares its cores; threads spinning against each other cost 10x
    try:
        import av  # noqa: F401
        has_av = True
    except ImportError:
        has_av = False
    matmul, rows, notes = matmul_tflops(cuda), [], list(args.note)
    if not has_av:
        notes.append("PyAV (av) was not installed in this run: no MP4 encode times")
    for name in dict.fromkeys(n for n, _ in runs):
        spec = spec_for(name, args.shapes)
        ctx = argparse.Namespace(name=name, spec=spec, cuda=cuda, args=args, matmul=matmul, has_av=has_av, built={},
                                 device="cuda:0" if cuda else "cpu", pipe=None, compiled=None, reference={},
                                 latents_only=spec["experts"] == 2,
                                 sync=torch.cuda.synchronize if cuda else (lambda: None))
        t = time.perf_counter()
        ctx.components = build_components(spec, ctx.device, torch.bfloat16 if cuda else torch.float32)
        print(f"{name}: weights made in {time.perf_counter() - t:.0f} s", flush=True)
        ctx.folder, ctx.scheduler = write_folder(spec, ctx.components, Path(args.workdir) / f"{args.shapes}-{name}")
        steps = 2 if spec["experts"] == 2 else args.steps
        modes = [m for m in MODE_ORDER if m in args.modes and (spec["experts"] == 1 or not m.endswith("compile"))]
        modes = [m for m in modes if cuda or not m.endswith("compile")]      # no compile on a CPU check
        try:
            for _, size in [r for r in runs if r[0] == name]:
                for mode in modes:
                    rows.append(measure(ctx, mode, tuple(map(int, size.split("x"))), steps))
                    print(json.dumps(rows[-1]), flush=True)
                    write_results(rows, args.out, matmul, notes=notes)   # after every row: a timeout keeps it
        finally:
            for st in ctx.built.values():
                for s in st.values():
                    s.close()
            del ctx
            torch._dynamo.reset()
            release_memory()
    write_results(rows, args.out, matmul, notes=notes)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
