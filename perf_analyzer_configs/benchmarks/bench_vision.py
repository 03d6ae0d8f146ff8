"""Vision benchmark: Qwen3.5 image/video -> text and V-JEPA2 video embeddings, our steps in-process (the
classes the ensembles run), the same ensembles behind tritonserver, and transformers, in one run on one GPU.

    python -m perf_analyzer_configs.benchmarks.bench_vision                       # on the GPU machine
    python -m perf_analyzer_configs.benchmarks.bench_vision --shapes tiny --out /tmp/vision_tiny.json   # CPU check

Qwen3.5-0.8B and -9B (their released config shapes, random bf16 weights: the AR and vision steps'
`load_format=dummy`): one 1024x1024 image and a question, 256 output tokens (EOS ignored), c = 1, 8, 32
requests at once; a video of 32 frames at 448x448 (c = 1); at c = 1 also a text-only prompt of the same
length (its time to first token) and the vision tower's own time for the image. transformers:
Qwen3_5ForConditionalGeneration.generate on the same inputs, the c requests as one batch (no padding:
equal lengths). V-JEPA2 ViT-L (vjepa2-vitl-fpc64-256's shape): 16-frame 256x256 clips, c = 1 and 16, our
encoder step vs VJEPA2Model.get_vision_features; served, the encoder step is called directly with the
clips' tubelets (decoding happens on the CPU before it either way).

Needs on the GPU machine: transformers >= 5.24 and Pillow (carried if absent); PyAV only for the served
video row (skipped without it: the in-process row cuts the frames itself); the server bundle for the
served rows (`--modes ours transformers` runs without it).
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks.ar_checkpoints import QWEN3_5_COMMON
from perf_analyzer_configs.benchmarks.common import ROOT, device_name, percentile, release_memory, start_server, versions

VISION_IDS = {"<|vision_start|>": 248053, "<|vision_end|>": 248054, "<|image_pad|>": 248056, "<|video_pad|>": 248057}
QWEN = {   # the released Qwen3.5 config.json files (text_config, vision_config)
    "qwen3.5-0.8b": dict(text=dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                                   num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=16),
                         vision=dict(depth=12, hidden_size=768, intermediate_size=3072, num_heads=12, out_hidden_size=1024),
                         tie=True),
    "qwen3.5-9b": dict(text=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
                                 num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=32),
                       vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096),
                       tie=False),
}
VJEPA2 = {"vjepa2-vitl": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, crop_size=256,
                              patch_size=16, tubelet_size=2, frames_per_clip=64)}
REAL = dict(image=1024, video=(32, 448), out_tokens=256, concurrency=[1, 8, 32], clip_frames=16, clip_c=[1, 16])
TINY = dict(image=64, video=(8, 64), out_tokens=8, concurrency=[1, 2], clip_frames=4, clip_c=[1, 2])
QUESTION = "What is in this picture? Describe it in detail."
MODES = ("ours", "server", "transformers")


# -- checkpoints: configs + tokenizer, no weights ----------------------------------------------------
def qwen_folder(name: str, root: Path, tiny: bool) -> Path:
    from transformers import Qwen3_5Config

    from triton_omni.converters.tiny_common import synthetic_tokenizer
    from triton_omni.converters.tiny_vision import VL_TEMPLATE, qwen3_5_vl

    folder = root / name
    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True)
    if tiny:                        # the tiny checkpoint itself (random weights, loaded for real)
        qwen3_5_vl(folder)
        return folder
    shape = QWEN[name]
    common = {k: v for k, v in QWEN3_5_COMMON.items() if k != "model_type"}
    config = Qwen3_5Config(text_config=dict(common, **shape["text"], tie_word_embeddings=shape["tie"]),
                           vision_config=dict(shape["vision"], patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                                              num_position_embeddings=2304),
                           tie_word_embeddings=shape["tie"], image_token_id=VISION_IDS["<|image_pad|>"],
                           video_token_id=VISION_IDS["<|video_pad|>"], vision_start_token_id=VISION_IDS["<|vision_start|>"],
                           vision_end_token_id=VISION_IDS["<|vision_end|>"])
    config.save_pretrained(str(folder))
    bos = common["bos_token_id"]
    specials = {s: bos + i for i, s in enumerate(("<|endoftext|>", "<|im_start|>", "<|im_end|>"))} | VISION_IDS
    tok = synthetic_tokenizer(folder, common["vocab_size"], specials)
    tok.chat_template = VL_TEMPLATE
    tok.save_pretrained(str(folder))
    image = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
             "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
    (folder / "preprocessor_config.json").write_text(json.dumps(image))
    (folder / "video_preprocessor_config.json").write_text(json.dumps(
        {**image, "size": {"shortest_edge": 4096, "longest_edge": 25165824}, "fps": 2, "min_frames": 4, "max_frames": 768}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [common["eos_token_id"]]}))
    return folder


def vjepa2_folder(name: str, root: Path, tiny: bool) -> Path:
    from transformers import VJEPA2Config

    from triton_omni.converters.tiny_vision import vjepa2

    folder = root / name
    if not (folder / "config.json").exists():
        folder.mkdir(parents=True)
        vjepa2(folder) if tiny else VJEPA2Config(**VJEPA2[name]).save_pretrained(str(folder))
    return folder


# -- workloads --------------------------------------------------------------------------------------
def picture(side: int, seed: int) -> bytes:
    from triton_omni.media.image import encode_image

    return encode_image(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8))


def frames(n: int, side: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (side, side, 3), dtype=np.uint8) for _ in range(n)]


def strings(*values) -> np.ndarray:
    return np.array([v if isinstance(v, bytes) else v.encode() for v in values], dtype=object)


def chat_request(kind: str, media: bytes | None, out_tokens: int, extra: str = ""):
    from triton_omni.runtime.step import Request

    part = [{"type": kind}] if kind != "text" else []
    content = part + [{"type": "text", "text": QUESTION + (" " + extra if extra else "")}]
    t = {"messages": strings(json.dumps([{"role": "user", "content": content}])),
         "sampling_parameters": strings(json.dumps({"max_tokens": out_tokens, "temperature": 0, "ignore_eos": True}))}
    if media is not None:
        t[f"{kind}s"] = strings(media)
    return Request(t)


class Ctx:
    def __init__(self, args):
        self.args, self.cuda = args, torch.cuda.is_available()
        self.device, self.target = ("cuda:0", "gpu") if self.cuda else ("cpu", "cpu")
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_vision_"))
        self.w = TINY if args.shapes == "tiny" else REAL
        self.rows, self.notes = [], []

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def steps_of(ctx, name: str, folder: Path, keys: list[str], dummy: bool) -> dict:
    from triton_omni.converters.schema import load_ensemble
    from triton_omni.runtime.params import parse_params
    from triton_omni.runtime.step import StepContext

    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{name}.yaml")
    out = {}
    for s in cfg.steps:
        if s.key not in keys:
            continue
        raw = cfg.resolved_parameters(s, ctx.target)
        raw["checkpoint"] = str(folder)
        if dummy and "load_format" in raw:
            raw["load_format"] = "dummy"
        sctx = StepContext(model_name=cfg.model_name(s), params=parse_params(s.cls.Params, raw), base_dir=ROOT,
                           device=ctx.device if s.kind == "gpu" else "cpu", max_batch_size=cfg.max_batch_size)
        out[s.key] = s.cls(sctx)
    return out


def checked(outputs):
    for o in outputs:
        if isinstance(o, BaseException):
            raise o
    return outputs


# -- Qwen3.5: ours in-process -------------------------------------------------------------------------
def qwen_ours(ctx, folder: Path, dummy: bool):
    from triton_omni.ar.embeds_step import ARDecodeWithEmbeds, placeholder_ids
    from triton_omni.ar.prompt_embeds import PromptEmbeds, placeholder_index
    from triton_omni.ar.sampling import SamplingParams
    from triton_omni.runtime.step import Request

    steps = steps_of(ctx, "qwen3_5_vl_chat", folder, ["pre", "vision", "ar"], dummy)
    steps["ar"].close()                     # its engine, driven here from this thread instead of its loop
    engine, holes = steps["ar"].engine, placeholder_ids(folder)

    def run(requests, pre_done=None):
        """Pre (CPU) -> vision -> engine for requests sent at once: per request its time to first token."""
        t0 = time.perf_counter()
        pre = pre_done or checked(steps["pre"].execute(requests))
        vision = checked(steps["vision"].execute([Request({"pixels": o["pixels"], "grid_thw": o["grid_thw"]}) for o in pre]))
        first, n = {}, 0
        for o, v in zip(pre, vision):
            params = SamplingParams.from_resolved(json.loads(o["sampling"][0]))
            ids = o["input_ids"]
            embeds = PromptEmbeds(torch.as_tensor(v["prompt_embeds"]), placeholder_index(ids, holes),
                                  o["rope_positions"].astype(np.int64))
            seq = engine.add(ids, params, on_output=lambda s, new, r: first.setdefault(s.seq_id, time.perf_counter()),
                             embeds=embeds)
            n += params.max_tokens
        engine.run_until_done()
        end = time.perf_counter()
        return [t - t0 for t in first.values()], end - t0, n

    return steps, run


def qwen_rows(ctx, name: str, folder: Path, modes, dummy: bool):
    from triton_omni.runtime.step import Request

    w = ctx.w
    image_reqs = lambda c: [chat_request("image", picture(w["image"], i), w["out_tokens"]) for i in range(c)]  # noqa: E731
    if "ours" in modes:
        steps, run = qwen_ours(ctx, folder, dummy)
        run(image_reqs(1))                                  # warm-up: allocations, kernels, graphs of each shape
        for c in w["concurrency"]:
            run(image_reqs(c))
            ttft, wall, n = run(image_reqs(c))
            record(ctx, name, "image", "ours", c, ttft, wall, n)
        # c = 1 extras: the tower alone, a text-only prompt as long as the image prompt, the video
        (pre,) = checked(steps["pre"].execute(image_reqs(1)))
        tower = []
        for _ in range(5):
            t = time.perf_counter()
            steps["vision"].execute([Request({"pixels": pre["pixels"], "grid_thw": pre["grid_thw"]})])
            ctx.sync()
            tower.append(time.perf_counter() - t)
        ctx.rows.append(dict(model=name, workload="image: vision tower alone", mode="ours", c=1,
                             tower_ms=1e3 * statistics.median(tower)))
        # text only, through the pre step too: a question padded with letters to the image prompt's length
        (short,) = checked(steps["pre"].execute([chat_request("text", None, 1)]))
        letters = np.random.default_rng(0).choice(list("abcdefgh"), max(1, len(pre["input_ids"]) - len(short["input_ids"])))
        text = [chat_request("text", None, w["out_tokens"], extra="".join(letters))]
        run(text)
        ttft, wall, n = run(text)
        record(ctx, name, "text (same length)", "ours", 1, ttft, wall, n)
        video = video_pre(ctx, steps["pre"], folder)
        run(None, [video])
        ttft, wall, n = run(None, [video])
        record(ctx, name, "video", "ours", 1, ttft, wall, n)
        steps_release(steps)
    if "server" in modes:
        qwen_server(ctx, name, folder, image_reqs, dummy)
    if "transformers" in modes:
        qwen_transformers(ctx, name, folder, image_reqs)


def video_pre(ctx, pre_step, folder: Path) -> dict:
    """The pre step's outputs for the video question, from frames cut here (no PyAV needed)."""
    from triton_omni.vision.qwen3_5_vl import processor as proc

    n, side = ctx.w["video"]
    layout = pre_step.layout
    patches, grid = proc.video_patches(frames(n, side, 7), layout, pre_step.params.max_video_pixels)
    times = proc.timestamps(np.arange(n), 2.0, layout.temporal_patch_size)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}]
    text = pre_step.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = np.asarray(pre_step.encode([proc.expand_prompt(text, [], [(grid, times)], layout.merge_size)])[0], np.int64)
    from triton_omni.ar.sampling import SamplingParams
    from triton_omni.vision.qwen3_5_vl.steps import rope_grid_positions

    params = SamplingParams(max_tokens=ctx.w["out_tokens"], temperature=0, ignore_eos=True)
    sampling = params.resolve(len(ids), pre_step.params.max_model_len, len(pre_step.tokenizer))
    return {"input_ids": ids.astype(np.int32), "sampling": strings(json.dumps(sampling.to_dict())), "pixels": patches,
            "grid_thw": np.asarray([grid], np.int64), "rope_positions": rope_grid_positions(ids, pre_step.config, [grid])}


def steps_release(steps):
    for s in steps.values():
        s.close()
    steps.clear()
    release_memory()


def record(ctx, name, workload, mode, c, ttft, wall, tokens):
    row = dict(model=name, workload=workload, mode=mode, c=c, ttft_p50_ms=1e3 * percentile(ttft, 0.5),
               ttft_p90_ms=1e3 * percentile(ttft, 0.9), tokens_per_s=tokens / wall, wall_s=wall)
    print(json.dumps(row), flush=True)
    ctx.rows.append(row)


# -- Qwen3.5: behind tritonserver ---------------------------------------------------------------------
def qwen_server(ctx, name, folder, image_reqs, dummy: bool):
    from triton_omni.client.chat import ChatClient

    overrides = ["qwen3_5_vl_chat.ar.load_format=dummy", "qwen3_5_vl_chat.vision.load_format=dummy"] if dummy else []
    try:
        server = start_server("qwen3_5_vl_chat", folder, overrides, ctx.work, ctx.target)
    except Exception as e:  # noqa: BLE001 - the other modes' rows still count
        ctx.notes.append(f"{name} server: not started ({e})")
        return
    try:
        client = ChatClient(server.grpc_url, timeout_s=1800)

        def one(kind, media, out):
            t0 = time.perf_counter()
            first, n = None, 0
            for chunk in client.stream("qwen3_5_vl_chat", messages=[{"role": "user", "content": [
                    {"type": kind}, {"type": "text", "text": QUESTION}]}], images=[media] if kind == "image" else None,
                    videos=[media] if kind == "video" else None,
                    sampling={"max_tokens": ctx.w["out_tokens"], "temperature": 0, "ignore_eos": True}):
                first = first or time.perf_counter() - t0
                n = chunk.completion_tokens
            out.append((first, n))

        def wave(kind, media_list):
            out = []
            threads = [threading.Thread(target=one, args=(kind, m, out)) for m in media_list]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return [f for f, _ in out], time.perf_counter() - t0, sum(n for _, n in out)

        wave("image", [picture(ctx.w["image"], 0)])
        for c in ctx.w["concurrency"]:
            images = [picture(ctx.w["image"], i) for i in range(c)]
            wave("image", images)
            record(ctx, name, "image", "server", c, *wave("image", images))
        try:
            from triton_omni.media.video_decode import encode_test_video

            n, side = ctx.w["video"]
            clip = encode_test_video(frames(n, side, 7), fps=2)
            wave("video", [clip])
            record(ctx, name, "video", "server", 1, *wave("video", [clip]))
        except ImportError as e:
            ctx.notes.append(f"{name} server video: skipped ({e}; PyAV not installed)")
    finally:
        server.stop()
        release_memory()


# -- Qwen3.5: transformers ----------------------------------------------------------------------------
def qwen_transformers(ctx, name, folder, image_reqs):
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    from triton_omni.vision.qwen3_5_vl import processor as proc
    from triton_omni.vision.qwen3_5_vl.steps import Qwen3_5VLPreprocess

    steps = steps_of(ctx, "qwen3_5_vl_chat", folder, ["pre"], False)
    config = AutoConfig.from_pretrained(str(folder))
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    with torch.device(ctx.device):
        model = Qwen3_5ForConditionalGeneration(config).to(dtype).eval()
    layout = proc.load_layout(folder)
    per = layout.temporal_patch_size * layout.patch_size ** 2
    scale = torch.tensor(layout.image_std).repeat_interleave(per).to(ctx.device)
    mean = torch.tensor(layout.image_mean).repeat_interleave(per).to(ctx.device)

    def inputs(outs, kind="image"):
        ids = torch.tensor(np.stack([o["input_ids"] for o in outs]).astype(np.int64), device=ctx.device)
        pix = torch.from_numpy(np.concatenate([o["pixels"] for o in outs])).to(ctx.device).float()
        pix = ((pix / 255 - mean) / scale).to(dtype)
        grid = torch.from_numpy(np.concatenate([o["grid_thw"] for o in outs])).to(ctx.device)
        token = config.image_token_id if kind == "image" else config.video_token_id
        types = (ids == token).int() * (1 if kind == "image" else 2)
        key = "" if kind == "image" else "_videos"
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": types,
                f"pixel_values{key}": pix, f"{kind}_grid_thw": grid}

    def gen(kw, n):
        ctx.sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(**kw, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        ctx.sync()
        return time.perf_counter() - t0

    try:
        pre = checked(steps["pre"].execute(image_reqs(1)))
        gen(inputs(pre), 2)                                                 # warm-up
        for c in ctx.w["concurrency"]:
            kw = inputs(checked(steps["pre"].execute(image_reqs(c))))
            ttft = gen(kw, 1)
            wall = gen(kw, ctx.w["out_tokens"])
            record(ctx, name, "image", "transformers", c, [ttft] * c, wall, c * ctx.w["out_tokens"])
        video = video_pre(ctx, steps["pre"], folder)
        kw = inputs([video], "video")
        ttft = gen(kw, 1)
        record(ctx, name, "video", "transformers", 1, [ttft], gen(kw, ctx.w["out_tokens"]), ctx.w["out_tokens"])
    finally:
        del model
        steps_release(steps)


# -- V-JEPA2 ------------------------------------------------------------------------------------------
def vjepa2_rows(ctx, name: str, folder: Path, modes, dummy: bool):
    from triton_omni.runtime.step import Request
    from triton_omni.vision.vjepa2.model import tubelets
    from triton_omni.vision.vjepa2.steps import load_layout

    layout = load_layout(folder)
    clips = [tubelets(np.stack(frames(ctx.w["clip_frames"], layout.crop, i)), layout.tubelet, layout.patch)
             for i in range(max(ctx.w["clip_c"]))]

    def clip_row(mode, c, times):
        row = dict(model=name, workload=f"{ctx.w['clip_frames']}-frame clip", mode=mode, c=c,
                   clips_per_s=c / statistics.median(times), latency_p50_ms=1e3 * statistics.median(times))
        print(json.dumps(row), flush=True)
        ctx.rows.append(row)

    if "ours" in modes:
        step = steps_of(ctx, "vjepa2_embed", folder, ["encode"], dummy)["encode"]
        for c in ctx.w["clip_c"]:
            times = []
            for _ in range(6):
                t0 = time.perf_counter()
                checked(step.execute([Request({"pixels": x}) for x in clips[:c]]))
                ctx.sync()
                times.append(time.perf_counter() - t0)
            clip_row("ours", c, times[1:])
        step.close()
        release_memory()
    if "server" in modes:
        import tritonclient.grpc as grpcclient

        from triton_omni.client.tensors import make_inputs

        overrides = ["vjepa2_embed.encode.load_format=dummy"] if dummy else []
        try:
            server = start_server("vjepa2_embed", folder, overrides, ctx.work, ctx.target)
        except Exception as e:  # noqa: BLE001
            ctx.notes.append(f"{name} server: not started ({e})")
            server = None
        if server is not None:
            try:
                def one(x):
                    client = grpcclient.InferenceServerClient(server.grpc_url)
                    try:
                        client.infer("vjepa2_embed_encode", make_inputs(grpcclient, {"pixels": (x, "UINT8")}),
                                     client_timeout=600)
                    finally:
                        client.close()

                for c in ctx.w["clip_c"]:
                    times = []
                    for _ in range(6):
                        threads = [threading.Thread(target=one, args=(x,)) for x in clips[:c]]
                        t0 = time.perf_counter()
                        for t in threads:
                            t.start()
                        for t in threads:
                            t.join()
                        times.append(time.perf_counter() - t0)
                    clip_row("server", c, times[1:])
            finally:
                server.stop()
                release_memory()
    if "transformers" in modes:
        from transformers import AutoConfig, VJEPA2Model

        dtype = torch.bfloat16 if ctx.cuda else torch.float32
        with torch.device(ctx.device):
            model = VJEPA2Model(AutoConfig.from_pretrained(str(folder))).to(dtype).eval()
        mean, std = torch.tensor(layout.mean, device=ctx.device), torch.tensor(layout.std, device=ctx.device)
        for c in ctx.w["clip_c"]:
            raw = torch.from_numpy(np.stack([np.stack(frames(ctx.w["clip_frames"], layout.crop, i)) for i in range(c)]))
            times = []
            for _ in range(6):
                t0 = time.perf_counter()
                x = ((raw.to(ctx.device).float() / 255 - mean) / std).permute(0, 1, 4, 2, 3).to(dtype)
                with torch.inference_mode():
                    model.get_vision_features(x)
                ctx.sync()
                times.append(time.perf_counter() - t0)
            clip_row("transformers", c, times[1:])
        del model
        release_memory()


# -- the page -------------------------------------------------------------------------------------------
PAGE = results.Page(
    title="Vision: Qwen3.5 image/video -> text, V-JEPA2 video embeddings",
    module="perf_analyzer_configs.benchmarks.bench_vision",
    columns=[results.column("model", "model", numeric=False), results.column("workload", "workload", numeric=False),
             results.column("mode", "mode", numeric=False), results.column("c", "c"),
             results.column("TTFT p50 ms", "ttft_p50_ms", ".1f"), results.column("TTFT p90 ms", "ttft_p90_ms", ".1f"),
             results.column("tokens/s", "tokens_per_s", ".0f"), results.column("tower ms", "tower_ms", ".1f"),
             results.column("clips/s", "clips_per_s", ".2f"), results.column("latency p50 ms", "latency_p50_ms", ".1f")],
    intro=lambda data: [f"Shapes: {data.get('shapes')}; workload: {data.get('workload')}.",
                        "tokens/s: output tokens of all c requests / the wave's wall time. TTFT: from sending to the "
                        "first token (transformers: a generate of one token for the batch). tower ms: the vision step "
                        "for one image alone. Targets (issue): image c=32 tokens/s >= 4x transformers; TTFT at c=1 <= "
                        "1.5x the text-only TTFT + the tower's time; V-JEPA2 clips/s >= 2x transformers."],
    order=lambda r: (r["model"], r["workload"], r["c"], MODES.index(r["mode"])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", choices=["real", "tiny"], default="real")
    ap.add_argument("--models", nargs="*", default=None, help=f"default: {', '.join([*QWEN, *VJEPA2])}")
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    ap.add_argument("--workdir", default=None, help="checkpoint configs and server logs (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=results.RESULTS / "vision.json")
    args = ap.parse_args(argv)
    ctx = Ctx(args)
    tiny = args.shapes == "tiny"
    models = args.models or (["qwen3.5-tiny", "vjepa2-tiny"] if tiny else [*QWEN, *VJEPA2])
    for name in models:
        try:
            if name.startswith("qwen"):
                qwen_rows(ctx, name, qwen_folder(name, ctx.work, tiny), args.modes, dummy=not tiny)
            else:
                vjepa2_rows(ctx, name, vjepa2_folder(name, ctx.work, tiny), args.modes, dummy=not tiny)
        except Exception as e:  # noqa: BLE001 - one model's failure is a note; the others run
            import traceback

            traceback.print_exc()
            ctx.notes.append(f"{name}: failed ({type(e).__name__}: {e})")
    meta = {"gpu": device_name(), "versions": versions("transformers", "triton"), "shapes": args.shapes,
            "workload": {k: v for k, v in ctx.w.items()}}
    results.write(args.out, PAGE, ctx.rows, meta, notes=ctx.notes)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
