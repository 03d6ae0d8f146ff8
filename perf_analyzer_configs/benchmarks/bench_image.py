"""Image generation benchmark: our image steps in-process (the classes the ensemble runs), the same
ensemble behind tritonserver, and the diffusers pipelines (eager and torch.compile), on the released
Z-Image-Turbo and FLUX.2-klein-4B shapes with random bf16 weights, in one run on one GPU.

    python -m perf_analyzer_configs.benchmarks.bench_image             # on the GPU machine
    python -m perf_analyzer_configs.benchmarks.bench_image --dry-run   # parameter and FLOP counts (no weights)
    python -m perf_analyzer_configs.benchmarks.bench_image --shapes tiny --modes ours diffusers --out /tmp/image_tiny.json

Weights are built on the device from the configs below (no download) and shared by every mode, so
the modes' images can be compared (column "Δpx": max |pixel difference| of request 0 against the
first mode that made it). Writes perf_analyzer_configs/results/image.json and its pages.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import random
import shutil
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
import triton_omni.image.denoise
import triton_omni.image.vae
from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks import fp8_accuracy
from triton_omni.client.progress import bar
from perf_analyzer_configs.benchmarks.ar_checkpoints import QWEN3_COMMON, SPECIALS
from perf_analyzer_configs.benchmarks.common import (ROOT, device_name, percentile, release_memory, start_server,
                                                     versions)
from triton_omni.converters.schema import load_ensemble
from triton_omni.converters.tiny_common import synthetic_tokenizer
from triton_omni.diffusion.checkpoint import load_scheduler, load_tokenizer
from triton_omni.image.z_image.transformer import ZImageContext
from triton_omni.runtime.params import parse_params
from triton_omni.runtime.step import Request, StepContext

# Qwen/Qwen3-4B config.json: the text encoder of both models (text_encoder/config.json of each repo).
QWEN3_4B = dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, tie_word_embeddings=True, **QWEN3_COMMON)
VAE_BLOCKS = dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                  up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[128, 256, 512, 512],
                  layers_per_block=2, norm_num_groups=32, act_fn="silu", mid_block_add_attention=True,
                  sample_size=1024)
MODELS = {
    # Tongyi-MAI/Z-Image-Turbo: transformer/, vae/ (the FLUX.1 VAE), text_encoder/, scheduler/ config.json.
    # Model card (and diffusers' ZImagePipeline example): 8 steps (9 in the card: 8 DiT calls), guidance 0.
    "z_image_turbo": dict(
        pipeline="ZImagePipeline", steps=8, guidance=0.0, index={},
        transformer=("ZImageTransformer2DModel", dict(
            all_patch_size=[2], all_f_patch_size=[1], in_channels=16, dim=3840, n_layers=30, n_refiner_layers=2,
            n_heads=30, n_kv_heads=30, norm_eps=1e-5, qk_norm=True, cap_feat_dim=2560, rope_theta=256.0,
            t_scale=1000.0, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512])),
        vae=("AutoencoderKL", dict(VAE_BLOCKS, latent_channels=16, scaling_factor=0.3611, shift_factor=0.1159,
                                   force_upcast=True, use_quant_conv=False, use_post_quant_conv=False)),
        text_encoder=("Qwen3Model", QWEN3_4B),
        scheduler=dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)),
    # black-forest-labs/FLUX.2-klein-4B (model_index.json: is_distilled): 4 steps, guidance 1.0 (ignored).
    "flux2_klein": dict(
        pipeline="Flux2KleinPipeline", steps=4, guidance=1.0, index={"is_distilled": True},
        transformer=("Flux2Transformer2DModel", dict(
            patch_size=1, in_channels=128, out_channels=None, num_layers=5, num_single_layers=20,
            attention_head_dim=128, num_attention_heads=24, joint_attention_dim=7680, timestep_guidance_channels=256,
            mlp_ratio=3.0, axes_dims_rope=[32, 32, 32, 32], rope_theta=2000, eps=1e-6, guidance_embeds=False)),
        vae=("AutoencoderKLFlux2", dict(VAE_BLOCKS, latent_channels=32, patch_size=[2, 2], batch_norm_eps=1e-4,
                                        batch_norm_momentum=0.1, use_quant_conv=True, use_post_quant_conv=True)),
        text_encoder=("Qwen3ForCausalLM", QWEN3_4B),
        scheduler=dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                       base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential")),
}
TINY_QWEN3 = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  vocab_size=512, bos_token_id=300, eos_token_id=302)
TINY_VAE = dict(block_out_channels=[8, 16, 16, 16], layers_per_block=1, norm_num_groups=8)
TINY = {   # converters/tiny_image.py's shapes: same structure, seconds on a CPU
    "z_image_turbo": dict(transformer=dict(dim=64, n_layers=2, n_refiner_layers=1, n_heads=2, n_kv_heads=2,
                                           cap_feat_dim=32, axes_dims=[8, 12, 12], axes_lens=[1024, 256, 256]),
                          vae=TINY_VAE, text_encoder=dict(TINY_QWEN3, num_hidden_layers=3)),
    "flux2_klein": dict(transformer=dict(in_channels=32, num_layers=1, num_single_layers=1, attention_head_dim=16,
                                         num_attention_heads=2, joint_attention_dim=96, axes_dims_rope=[4, 4, 4, 4]),
                        vae=dict(TINY_VAE, latent_channels=8), text_encoder=dict(TINY_QWEN3, num_hidden_layers=28)),
}
SIZES = {"real": [1024, 512], "tiny": [64, 32]}
PROMPT_CHARS = 120       # byte-level tokenizer: one token per character, plus the chat template's
# ours-compile last: it compiles the blocks of the transformer copy that "ours" also runs, in place
MODE_ORDER = ["ours", "diffusers", "diffusers-compile", "server", "ours-compile"]
FLOPS_NOTE = ("Denoise FLOPs per image and transformer call = 2·P·T + 4·d·ΣL²: P = matmul weights a token passes "
              "through per block (4d² for q, k, v, out + 3·d·f for the SwiGLU MLP; Z-Image f = 8d/3, FLUX.2 f = 3d, "
              "the same in its double- and single-stream blocks), T = tokens through the block, L = attention "
              "length of each block (Z-Image: 2 refiner blocks on image and caption tokens apart, 30 on both, each "
              "part padded to 32; FLUX.2: 25 blocks on 4096 or 1024 image + 512 text tokens); embedders and the "
              "output projection included, per-image modulation left out. TFLOP/s = that / median call time "
              "(CUDA events around the transformer call); % = against the matmul rate measured in the same run. "
              "Our Z-Image calls leave out the caption embedder and refiner blocks: they run once per request, "
              "before the loop.")


def spec_for(name: str, shapes: str) -> dict:
    spec = dict(MODELS[name])
    for key, over in (TINY[name] if shapes == "tiny" else {}).items():
        spec[key] = (spec[key][0], {**spec[key][1], **over})
    return spec


def qwen3_config(cfg: dict):
    return transformers.Qwen3Config(**{k: v for k, v in cfg.items() if k != "model_type"})


def build_components(spec: dict, device, dtype) -> dict:
    """Transformer, VAE and text encoder from their configs with random weights, made on `device`."""
    torch.manual_seed(0)
    out = {}
    with torch.device(device):
        for key in ("transformer", "vae"):
            out[key] = getattr(diffusers, spec[key][0]).from_config(spec[key][1]).to(dtype).eval()
        cls, cfg = spec["text_encoder"]
        out["text_encoder"] = getattr(transformers, cls)(qwen3_config(cfg)).to(dtype).eval()
    return out


def write_folder(spec: dict, folder: Path) -> Path:
    """A diffusers pipeline folder of configs and a tokenizer of the real vocabulary size; no weights."""
    index = {"_class_name": spec["pipeline"], "_diffusers_version": diffusers.__version__, **spec["index"],
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "tokenizer": ["transformers", "PreTrainedTokenizerFast"]}
    for key in ("transformer", "vae"):
        index[key] = ["diffusers", spec[key][0]]
        (folder / key).mkdir(parents=True, exist_ok=True)
        (folder / key / "config.json").write_text(json.dumps({"_class_name": spec[key][0], **spec[key][1]}, indent=1))
    cls, cfg = spec["text_encoder"]
    index["text_encoder"] = ["transformers", cls]
    qwen3_config(cfg).save_pretrained(str(folder / "text_encoder"))
    diffusers.FlowMatchEulerDiscreteScheduler(**spec["scheduler"]).save_pretrained(str(folder / "scheduler"))
    synthetic_tokenizer(folder / "tokenizer", cfg["vocab_size"],
                        {s: cfg["bos_token_id"] + i for i, s in enumerate(SPECIALS)})
    (folder / "model_index.json").write_text(json.dumps(index, indent=1))
    return folder


# --- FLOPs and timing ---------------------------------------------------------------------------
def image_flops(name: str, cfg: dict, img: int, txt: int, caption: bool = True) -> float:
    """One image's transformer call with `img` image and `txt` text tokens (formula: FLOPS_NOTE).
    Z-Image, `caption` False: our split call, whose caption embedding and refiner ran once before the loop."""
    if name == "z_image_turbo":
        d, pad = cfg["dim"], lambda n: n + (-n) % 32
        per, nr, n = 4 * d * d + 3 * d * int(d / 3 * 8), cfg["n_refiner_layers"], cfg["n_layers"]
        li, lc = pad(img), pad(txt)
        patch = cfg["all_patch_size"][0] ** 2 * cfg["in_channels"]     # x embedder in, final layer out
        cap_mm = per * nr * lc + cfg["cap_feat_dim"] * d * lc if caption else 0
        mm = per * (nr * li + n * (li + lc)) + 2 * patch * d * li + cap_mm
        return 2 * mm + 4 * d * (nr * (li * li + (lc * lc if caption else 0)) + n * (li + lc) ** 2)
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    layers, big = cfg["num_layers"] + cfg["num_single_layers"], img + txt
    mm = ((4 * d * d + 3 * d * int(d * cfg["mlp_ratio"])) * layers * big + 2 * cfg["in_channels"] * d * img
          + cfg["joint_attention_dim"] * d * txt)
    return 2 * mm + 4 * d * layers * big * big


def call_flops(name: str, cfg: dict, args, kwargs) -> tuple[float, int, int]:
    """(FLOPs, rows, text tokens of row 0) of one transformer call, read off its inputs."""
    if args and isinstance(args[0], ZImageContext):        # our split Z-Image call: (context, x, t)
        c = args[0]
        return sum(image_flops(name, cfg, c.tokens, n, caption=False) for n in c.caption_lens), \
            len(c.caption_lens), c.caption_lens[0]
    tokens = call_tokens(name, cfg, args, kwargs)
    return sum(image_flops(name, cfg, i, t) for i, t in tokens), len(tokens), tokens[0][1]


def call_tokens(name: str, cfg: dict, args, kwargs) -> list[tuple[int, int]]:
    """(image tokens, text tokens) of each row of one transformer call, read off its inputs."""
    if name == "z_image_turbo":
        p = cfg["all_patch_size"][0]
        return [(x.shape[-2] * x.shape[-1] // (p * p), c.shape[0]) for x, c in zip(args[0], args[2])]
    hs, ctx = kwargs["hidden_states"], kwargs["encoder_hidden_states"]
    return [(hs.shape[1], ctx.shape[1])] * hs.shape[0]


def stamp(cuda: bool):
    if not cuda:
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def seconds(start, end, cuda: bool) -> float:
    return start.elapsed_time(end) / 1e3 if cuda else end - start


@contextlib.contextmanager
def forward_timer(module, ctx):
    """Yields a list that gets [start, end, FLOPs, rows, text tokens] for every call of `module`."""
    calls = []
    if module is None:
        yield calls
        return

    def pre(m, args, kwargs):
        flops, rows, text = call_flops(ctx.name, ctx.tcfg, args, kwargs)
        calls.append([stamp(ctx.cuda), None, flops, rows, text])

    def post(m, args, out):
        calls[-1][1] = stamp(ctx.cuda)

    hooks = [module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post)]
    try:
        yield calls
    finally:
        for h in hooks:
            h.remove()


def matmul_tflops(cuda: bool) -> float:
    """bf16 8192³ on the GPU (fp32 1024³ on a CPU): median of 10 after 3 warm-ups."""
    n, dtype, dev = (8192, torch.bfloat16, "cuda") if cuda else (1024, torch.float32, "cpu")
    a, b = torch.randn(n, n, dtype=dtype, device=dev), torch.randn(n, n, dtype=dtype, device=dev)
    times = []
    for _ in range(13):
        start = stamp(cuda)
        a @ b
        end = stamp(cuda)
        if cuda:
            end.synchronize()
        times.append(seconds(start, end, cuda))
    return 2 * n ** 3 / statistics.median(times[3:]) / 1e12


# --- the modes: each gives (label, go(c) -> (latencies, wall, request 0's pixels, stages), warm-up c, module) --
def prompt(i: int) -> str:
    rng = random.Random(i)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(PROMPT_CHARS))


def request(ctx, i: int, size: int) -> dict:
    return {"prompt": np.array([prompt(i).encode()], dtype=object),
            "size": np.array([f"{size}x{size}".encode()], dtype=object),
            "num_inference_steps": np.array([ctx.spec["steps"]], np.int32),
            "guidance_scale": np.array([ctx.spec["guidance"]], np.float32), "seed": np.array([1000 + i], np.int64)}


def build_steps(ctx, compiled: bool = False, weights: str = "bf16") -> dict:
    """The ensemble's steps with its parameters for this target; they take the modules already built.
    `compiled`: the denoise step compiles the transformer's repeated blocks (its `compile` parameter);
    `weights` fp8: its `quantization` (on a copy of the weights of its own)."""
    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{ctx.name}.yaml")
    modules = (triton_omni.image.denoise, triton_omni.diffusion.text_encoder, triton_omni.image.vae)
    saved = [m.load_component for m in modules]
    # Our denoise step sets its transformer's attention kernel (its `attention` parameter) and compiles
    # its blocks: it gets a copy of the same weights, so the diffusers modes keep their defaults.
    if weights not in ctx.own:
        ctx.own[weights] = copy.deepcopy(ctx.components["transformer"])
    own = dict(ctx.components, transformer=ctx.own[weights])
    for m in modules:
        m.load_component = lambda folder, name, dtype="float32", device="cpu": own[name]
    try:
        steps = {}
        for s in cfg.steps:
            raw = cfg.resolved_parameters(s, "gpu" if ctx.cuda else "cpu")
            raw.update({"checkpoint": str(ctx.folder)} if "checkpoint" in raw else {})
            raw.update({"compile": "true"} if compiled and "compile" in raw else {})
            raw.update({"quantization": "fp8"} if weights != "bf16" and "quantization" in raw else {})
            sctx = StepContext(model_name=cfg.model_name(s), params=parse_params(s.cls.Params, raw), base_dir=ROOT,
                               device=ctx.device if s.kind == "gpu" else "cpu", max_batch_size=cfg.max_batch_size)
            steps[s.key] = s.cls(sctx)
        return steps
    finally:
        for m, f in zip(modules, saved):
            m.load_component = f


def run_steps(step, tensors):
    names = {t.name for t in step.inputs}
    for x, o in zip(tensors, step.execute([Request({k: v for k, v in x.items() if k in names}) for x in tensors])):
        if isinstance(o, BaseException):
            raise o
        x.update(o)


def ours(ctx, size, compiled: bool = False, weights: str = "bf16"):
    if (compiled, weights) not in ctx.steps:
        ctx.steps[compiled, weights] = build_steps(ctx, compiled, weights)
    steps = ctx.steps[compiled, weights]

    def go(c):
        tensors, stages, t0 = [request(ctx, i, size) for i in range(c)], {}, time.perf_counter()
        for key in ("pre", "text_encoder", "denoise", "vae_decode"):
            t = time.perf_counter()
            run_steps(steps[key], tensors)
            ctx.sync()
            stages[key] = time.perf_counter() - t
        for x in tensors:    # pixels on the host, where the pipelines' PIL images are
            x["pixels"] = x["pixels"].cpu().numpy() if isinstance(x["pixels"], torch.Tensor) else x["pixels"]
        wall = time.perf_counter() - t0
        t = time.perf_counter()
        run_steps(steps["encode"], tensors)
        stages["png_encode"] = time.perf_counter() - t      # reported apart: the pipelines don't encode
        return [wall] * c, wall, tensors[0]["pixels"][0], stages

    denoise = steps["denoise"]      # Z-Image's step calls the transformer's split forward, not its forward
    label = fp8_accuracy.label("ours-compile" if compiled else "ours", weights)
    return [(label, go, 0, getattr(denoise, "split_forward", denoise.transformer))]


def fp8_entry(ctx, size) -> dict:
    """FP8 against bf16 on the same weights (fp8_accuracy.image_accuracy): request 0 through both eager steps."""
    def latents(steps):
        tensors = [request(ctx, 0, size)]
        for key in ("pre", "text_encoder", "denoise"):
            run_steps(steps[key], tensors)
        return torch.as_tensor(tensors[0]["latents"])

    ref, q = ctx.steps[False, "bf16"], ctx.steps[False, "fp8"]
    rows = fp8_accuracy.image_accuracy(ref["denoise"].transformer, q["denoise"].transformer,
                                       lambda: latents(ref), lambda: latents(q))
    return {"model": f"{ctx.name} {size}x{size}", "weights": "fp8", "rows": rows}


def call(ctx, pipe, ids, size):
    """Requests `ids` in one pipeline call (prompts and seeds as ours); request 0's pixels."""
    gens = [torch.Generator().manual_seed(1000 + i) for i in ids]
    out = pipe(prompt=[prompt(i) for i in ids] if len(ids) > 1 else prompt(ids[0]), height=size, width=size,
               num_inference_steps=ctx.spec["steps"], guidance_scale=ctx.spec["guidance"],
               generator=gens if len(ids) > 1 else gens[0], output_type="pil")
    return np.asarray(out.images[0])


def diffusers_modes(ctx, size, compiled: bool):
    if ctx.pipe is None:
        ctx.pipe = getattr(diffusers, ctx.spec["pipeline"])(
            scheduler=load_scheduler(ctx.folder), tokenizer=load_tokenizer(ctx.folder), **ctx.components,
            **ctx.spec["index"])
        ctx.pipe.set_progress_bar_config(disable=True)
    pipe = ctx.pipe
    if compiled and ctx.compiled is None:
        pipe.transformer = ctx.components["transformer"]
        call(ctx, pipe, [0], size)                                      # an eager warm-up first
        ctx.compiled = torch.compile(ctx.components["transformer"], mode=ctx.args.compile_mode, dynamic=False)
    pipe.transformer = ctx.compiled if compiled else ctx.components["transformer"]

    def one_at_a_time(c):
        lat, images, t0 = [], [], time.perf_counter()
        for i in range(c):
            images.append(call(ctx, pipe, [i], size))
            lat.append(time.perf_counter() - t0)
        return lat, lat[-1], images[0], {}

    def batched(c):
        t0 = time.perf_counter()
        image = call(ctx, pipe, list(range(c)), size)
        wall = time.perf_counter() - t0
        return [wall] * c, wall, image, {}

    label = "diffusers-compile" if compiled else "diffusers"
    return [(label, one_at_a_time, 1, pipe.transformer), (f"{label} (batched)", batched, 0, pipe.transformer)]


def server(ctx, size):
    import io

    import tritonclient.grpc  # noqa: F401 - the client needs it
    from PIL import Image     # the encode step makes PNGs with Pillow

    from triton_omni.client.image import ImageClient
    from triton_omni.launcher.triton import find_install

    find_install()
    if ctx.server is None:     # the same random weights, saved for the server's steps to load
        weights = ctx.weights = write_folder(ctx.spec, Path(ctx.args.workdir) / f"{ctx.args.shapes}-{ctx.name}-weights")
        for key, module in ctx.components.items():
            module.save_pretrained(str(weights / key))
        ctx.server = start_server(ctx.name, weights, [], Path(ctx.args.workdir), "gpu" if ctx.cuda else "cpu")

    def go(c):
        results, lat, t0 = [None] * c, [0.0] * c, time.perf_counter()

        def worker(i):
            results[i] = ImageClient(ctx.server.grpc_url, timeout_s=900).generate(
                ctx.name, prompt(i), size=f"{size}x{size}", num_inference_steps=ctx.spec["steps"],
                guidance_scale=ctx.spec["guidance"], seed=1000 + i)
            lat[i] = time.perf_counter() - t0

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(c)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert all(results), "a request to the server failed (see the server log)"
        return lat, max(lat), np.asarray(Image.open(io.BytesIO(results[0][0])).convert("RGB")), {}

    return [("server", go, 0, None)]


def measure(ctx, mode, go, warm_c, module, size, c) -> dict:
    t = time.perf_counter()
    go(warm_c or c)                                   # warm-up (the compiled mode: compiles a new shape)
    warm_s = time.perf_counter() - t
    lat, walls, calls, stages = [], [], [], []
    for _ in range(ctx.args.repeats):
        with forward_timer(module, ctx) as timed:
            latencies, wall, image, st = go(c)
        ctx.sync()
        calls += [(seconds(s, e, ctx.cuda), *rest) for s, e, *rest in timed]
        lat, walls, stages = lat + latencies, walls + [wall], stages + [st]
    row = {"model": ctx.name, "size": f"{size}x{size}", "mode": mode, "concurrency": c, "steps": ctx.spec["steps"],
           "guidance": ctx.spec["guidance"], "repeats": ctx.args.repeats,
           "latency_ms_p50": 1e3 * statistics.median(lat), "latency_ms_p90": 1e3 * percentile(lat, 0.9),
           "images_per_s": c / statistics.median(walls)}
    if "compile" in mode:
        row["first_call_s"] = warm_s
    if calls:
        row.update(denoise_ms=1e3 * statistics.median(s for s, *_ in calls), denoise_rows=max(x[2] for x in calls),
                   text_tokens=calls[0][3], denoise_tflops=statistics.median(x[1] / x[0] for x in calls) / 1e12)
        row["matmul_share"] = row["denoise_tflops"] / ctx.matmul
    if stages[0]:
        row["stages_ms"] = {k: 1e3 * statistics.median(s[k] for s in stages) for k in stages[0]}
    ref = ctx.reference.setdefault(size, (mode, image))
    diff = np.abs(image.astype(np.int32) - ref[1].astype(np.int32))
    row.update(max_abs_diff_px=int(diff.max()), mean_abs_diff_px=float(diff.mean()), diff_against=ref[0])
    return row


# --- results ------------------------------------------------------------------------------------
def targets(rows) -> list[str]:
    by = {(r["model"], r["size"], r["mode"], r["concurrency"]): r for r in rows}
    out = []
    for model, size in dict.fromkeys((r["model"], r["size"]) for r in rows):
        sizes = sorted({r["size"] for r in rows if r["model"] == model}, key=lambda s: int(s.split("x")[0]))
        for ours in ("ours", "ours-compile"):
            mine, mine8 = by.get((model, size, ours, 1)), by.get((model, size, ours, 8))
            for other, goal in (("diffusers", 1.5), ("diffusers-compile", 1.1)):
                theirs = by.get((model, size, other, 1))
                if mine and theirs:
                    x = theirs["latency_ms_p50"] / mine["latency_ms_p50"]
                    out.append(f"{model} {size}: e2e c=1 {ours} {mine['latency_ms_p50']:.0f} ms vs {other} "
                               f"{theirs['latency_ms_p50']:.0f} ms = {x:.2f}x (target >= {goal}x): "
                               f"{'PASS' if x >= goal else 'FAIL'}")
            for r in (mine, mine8) if size == sizes[-1] else ():
                if r and "matmul_share" in r:
                    out.append(f"{model} {size}: {ours} c={r['concurrency']} denoise {r['denoise_tflops']:.3g} TFLOP/s "
                               f"= {100 * r['matmul_share']:.0f}% of the matmul rate (target >= 75%): "
                               f"{'PASS' if r['matmul_share'] >= 0.75 else 'FAIL'}")
            if size == sizes[0] and mine and mine8:
                x = mine8["images_per_s"] / mine["images_per_s"]
                out.append(f"{model} {size}: {ours} c=8 {mine8['images_per_s']:.2f} images/s vs one at a time (c=1) "
                           f"{mine['images_per_s']:.2f} = {x:.2f}x (target >= 1.5x): {'PASS' if x >= 1.5 else 'FAIL'}")
    return out + fp8_accuracy.speedups(rows, "denoise_ms", 1.4, "denoise ms/call", ("model", "size", "concurrency"))


def write_results(rows, path: Path, matmul: float, gpu=None, run_versions=None, date=None, notes=(), accuracy=()):
    meta = {"gpu": gpu or device_name(), "versions": run_versions or versions("diffusers", "transformers"),
            "matmul_tflops": matmul, "flops_formula": FLOPS_NOTE, "targets": targets(rows)}
    meta.update({"fp8_accuracy": list(accuracy)} if accuracy else {})
    results.write(path, PAGE, rows, meta, notes, date)


def intro(data) -> list[str]:
    return ["Random weights in the released configs (Z-Image-Turbo: 8 steps, guidance 0; FLUX.2-klein-4B: 4 steps, "
            f"guidance 1), one image per request, prompts of {PROMPT_CHARS} tokens + chat template. Latency: request "
            "in -> uint8 pixels on the host, per request (ours: PNG encoding apart, in stages_ms); c=8: 8 requests "
            "sent together (one-at-a-time modes serve them in turn). Medians over the repeats, after a warm-up. "
            "Matmul rate in this run (bf16 8192³; a CPU check: fp32 1024³): "
            f"{data['matmul_tflops']:.3g} TFLOP/s.", "", data["flops_formula"]]


def after(rows, data) -> list[str]:
    return ["Δpx: |pixel difference| of request 0 against the first mode of the run that made that size's image "
            "(same weights, prompt and seed): a sanity check, 0-1 in fp32 (`--shapes tiny` on a CPU). In bf16 the "
            "random weights amplify rounding, and FLUX.2's pipeline keeps its latents in bf16 (ours: fp32), so "
            "large values there are expected. first call s: the warm-up call after torch.compile (compiling a new "
            "shape + one run), kept out of the timings.", "", "Targets:", "", *[f"- {t}" for t in data["targets"]],
            *fp8_accuracy.table_lines(data.get("fp8_accuracy", []))]


MODE_LABELS = ["ours", "ours-compile", "diffusers", "diffusers (batched)", "diffusers-compile",
               "diffusers-compile (batched)", "server"]
PAGE = results.Page(
    title="Image generation benchmark", module="perf_analyzer_configs.benchmarks.bench_image", intro=intro,
    after=after,
    columns=[results.column("model", "model", numeric=False), results.column("size", "size", numeric=False),
             results.column("mode", "mode", numeric=False), results.column("c", "concurrency"),
             results.column("latency p50 ms", "latency_ms_p50", ".0f"), results.column("images/s", "images_per_s", ".2f"),
             results.Column("denoise ms/call (rows)",
                            lambda r: f"{r['denoise_ms']:.1f} ({r['denoise_rows']})" if "denoise_ms" in r else ""),
             results.column("denoise TFLOP/s", "denoise_tflops", ".3g"),
             results.Column("% matmul", lambda r: f"{100 * r['matmul_share']:.0f}%" if "matmul_share" in r else ""),
             results.Column("Δpx max / mean", lambda r: f"{r['max_abs_diff_px']}"
                            + (f" / {r['mean_abs_diff_px']:.1f}" if "mean_abs_diff_px" in r else "")),
             results.column("first call s", "first_call_s", ".0f")],
    order=lambda r: (list(MODELS).index(r["model"]), -int(r["size"].split("x")[0]),
                     MODE_LABELS.index(fp8_accuracy.base_mode(r["mode"])), fp8_accuracy.weights_of(r["mode"]) != "bf16",
                     r["concurrency"]),
    plot=results.Plot(panels=[("images_per_s", "images/s"), ("latency_ms_p50", "latency p50 (ms)")],
                      facet=lambda r: f"{r['model']} {r['size']}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--modes", nargs="+", default=list(MODE_ORDER), choices=MODE_ORDER)
    ap.add_argument("--shapes", default="real", choices=list(SIZES), help="tiny: seconds on a CPU, to check the script")
    ap.add_argument("--sizes", nargs="+", type=int, help="square sizes in pixels (default: 1024 512; tiny: 64 32)")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--repeats", type=int, help="timed runs per row (default 5; tiny: 2)")
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode of diffusers-compile")
    ap.add_argument("--weights", nargs="+", default=["bf16"], choices=["bf16", "fp8"],
                    help="our steps' transformer weights (fp8: the denoise step's quantization; with ours among the "
                         "modes, an accuracy table against bf16 too)")
    ap.add_argument("--workdir", default="/tmp/triton-omni-bench-image")
    ap.add_argument("--out", type=Path, default=results.RESULTS / "image.json")
    ap.add_argument("--dry-run", action="store_true", help="print parameter and FLOP counts (meta device), then stop")
    ap.add_argument("--merge", nargs="+", type=Path, help="combine the results of separate runs into --out")
    ap.add_argument("--note", action="append", default=[], help="a note for the results")
    args = ap.parse_args()
    args.sizes, args.repeats = args.sizes or SIZES[args.shapes], args.repeats or (2 if args.shapes == "tiny" else 5)
    diffusers.utils.logging.set_verbosity_error()
    if args.dry_run:
        for name in args.models:
            spec = spec_for(name, args.shapes)
            counts = {k: sum(p.numel() for p in m.parameters())
                      for k, m in build_components(spec, "meta", torch.bfloat16).items()}
            print(f"{name}: " + ", ".join(f"{k} {n / 1e9:.3f}B params" for k, n in counts.items()))
            txt = 512 if name == "flux2_klein" else PROMPT_CHARS + 19    # + the chat template
            for size in args.sizes:
                flops = image_flops(name, spec["transformer"][1], (size // 16) ** 2, txt)
                print(f"  {size}x{size}: {(size // 16) ** 2} image + {txt} text tokens: {flops / 1e12:.2f} TFLOP "
                      "per image and transformer call")
        return 0
    if args.merge:
        parts, rows, notes = results.merge_parts(args.merge, ("model", "size", "mode", "concurrency"), args.note)
        write_results(rows, args.out, parts[0]["matmul_tflops"], parts[0]["gpu"], parts[0]["versions"],
                      max(p["date"] for p in parts), notes, [e for p in parts for e in p.get("fp8_accuracy", [])])
        print(args.out.with_suffix(".md").read_text())
        return 0
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)   # a CPU check shares its cores; threads spinning against each other cost 10x
    matmul, rows, notes, accuracy = matmul_tflops(cuda), [], list(args.note), []
    for name in bar(args.models, desc="models", unit="model"):
        spec = spec_for(name, args.shapes)
        ctx = argparse.Namespace(name=name, spec=spec, tcfg=spec["transformer"][1], cuda=cuda, args=args, matmul=matmul,
                                 device="cuda:0" if cuda else "cpu", steps={}, own={}, pipe=None,
                                 compiled=None, server=None,
                                 reference={}, sync=torch.cuda.synchronize if cuda else (lambda: None))
        ctx.folder = write_folder(spec, Path(args.workdir) / f"{args.shapes}-{name}")
        t = time.perf_counter()
        ctx.components = build_components(spec, ctx.device, torch.bfloat16 if cuda else torch.float32)
        print(f"{name}: weights made in {time.perf_counter() - t:.0f} s", flush=True)
        try:
            for mode, size in [(m, s) for m in MODE_ORDER if m in args.modes for s in args.sizes]:
                if mode not in args.modes:
                    continue                                   # server mode, skipped below
                try:
                    variants = ([v for w in args.weights for v in ours(ctx, size, mode == "ours-compile", w)]
                                if mode.startswith("ours")
                                else server(ctx, size) if mode == "server"
                                else diffusers_modes(ctx, size, mode == "diffusers-compile"))
                except (ImportError, RuntimeError, TimeoutError) as exc:
                    if mode != "server":
                        raise
                    notes.append(f"{name}: server mode skipped ({type(exc).__name__}: {exc})".splitlines()[0])
                    args.modes.remove("server")
                    print(notes[-1], flush=True)
                    continue
                for label, go, warm_c, module in variants:
                    for c in [c for c in args.concurrency if c > 1 or not label.endswith("(batched)")]:
                        rows.append(measure(ctx, label, go, warm_c, module, size, c))
                        print(json.dumps(rows[-1]), flush=True)
                        write_results(rows, args.out, matmul, notes=notes, accuracy=accuracy)   # a timeout keeps every row
                if mode == "ours" and size == args.sizes[-1] and "fp8" in args.weights:   # before compiling in place
                    accuracy.append(fp8_entry(ctx, args.sizes[0]))
                    notes.append(fp8_accuracy.summary(accuracy[-1]["model"], "fp8", accuracy[-1]["rows"],
                                                      "bf16" if cuda else "fp32"))
                    print(notes[-1], flush=True)
        finally:
            if ctx.server is not None:
                ctx.server.stop()
            if "weights" in ctx:
                shutil.rmtree(ctx.weights, ignore_errors=True)   # gigabytes
            del ctx
            torch._dynamo.reset()
            release_memory()
    write_results(rows, args.out, matmul, notes=notes, accuracy=accuracy)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
