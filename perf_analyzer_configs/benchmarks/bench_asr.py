"""Speech recognition benchmark: RTFx (audio seconds transcribed per wall second) of Omnilingual ASR CTC
and of Qwen3-ASR behind tritonserver (gRPC), of their steps called in-process, and of transformers
(OmniASRForCTC batched; Qwen3ASRForConditionalGeneration.generate batched; eager: the baselines), on the
released shapes with random weights, in one run on one GPU; and the time to the first transcript piece
(for Qwen3-ASR, which streams: the first token's delta) at c=1.

    python -m perf_analyzer_configs.benchmarks.bench_asr                             # on the GPU machine
    python -m perf_analyzer_configs.benchmarks.bench_asr --smoke --out /tmp/asr_smoke.json   # tiny shapes, CPU check
    python -m perf_analyzer_configs.benchmarks.bench_asr --models qwen3_asr --out r2.json   # a part; then --merge r1.json r2.json

Qwen3-ASR (asr_qwen3.py): the 1.7B release's shape (24-layer audio encoder, Qwen3-1.7B decoder), the language
given (en), `--tokens` tokens decoded per request in every mode (random weights end anywhere otherwise).

Shapes: 300m (hidden 1024, 24 layers, ffn 4096), 1b (1280, 48, 5120), 3b (2048, 60, 8192), 7b (2048, 128,
8192); every one the 7-layer conv feature extractor (512 channels, 320 samples a frame), 16 heads, the v2
vocabulary (10,288). Weights are random (speed does not depend on them: a CTC model's work is fixed by the
audio's length), written once under --workdir with transformers' own class and a synthetic tokenizer of
that vocabulary; every mode loads the same files.

Workload: 30-second clips (speech-like noise under a syllable-rate envelope, a different one per request),
sent as 16 kHz mono 16-bit WAV (read without FFmpeg, media/audio.plain_wav: the GPU machine has no PyAV);
segmentation `window` (a 30 s clip is one window: no VAD, which the GPU machine lacks, and the same work).
server: c requests at once, each on its own gRPC stream; first transcript = its (only) response.
inprocess: the ensemble's steps built from ensemble_configs/omniasr_ctc.yaml with the server's parameters:
pre for each request, the encoder on the c requests together (as Triton's batcher hands them), post.
baseline: OmniASRFeatureExtractor on the c clips (padded batch) + OmniASRForCTC.generate + batch_decode.
RTFx: c x 30 s / the round's wall time; --repeats rounds per row after a warm-up (c=1, then the largest c).

Variant worth a row: `--set omniasr_ctc.encoder.compile=true` (torch.compile around the conv layers and the
attention of each layer; compiled on the first batches, so the warm-up rounds pay for it).

A GPU run needs, beyond the image: tritonserver (the server bundle), numpy 1.26, transformers >= 5.24 (the
OmniASR classes), tritonclient's Python files and python-rapidjson (server mode).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks.common import ROOT, device_name, percentile, release_memory, start_server, versions
from triton_omni.runtime.step import Request

MODES = ["server", "inprocess", "baseline"]
VOCAB = 10288
CONV = {"conv_dim": (512,) * 7}
SHAPES = {
    "300m": dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=4096, **CONV),
    "1b": dict(hidden_size=1280, num_hidden_layers=48, intermediate_size=5120, **CONV),
    "3b": dict(hidden_size=2048, num_hidden_layers=60, intermediate_size=8192, **CONV),
    "7b": dict(hidden_size=2048, num_hidden_layers=128, intermediate_size=8192, **CONV),
    "tiny": dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4, conv_dim=(16,) * 7,
                 num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
}
RATE = 16000


def write_checkpoint(root: Path, shape: str, device: str, dtype: torch.dtype) -> Path:
    """An OmniASRForCTC folder of `shape` with random weights (reused when already written)."""
    from transformers import OmniASRCTCConfig, OmniASRForCTC

    from triton_omni.converters.tiny_common import synthetic_tokenizer

    folder = root / f"omniasr-ctc-{shape}"
    if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists():
        return folder
    vocab = 512 if shape == "tiny" else VOCAB
    config = OmniASRCTCConfig(vocab_size=vocab, audio_config=SHAPES[shape], blank_token_id=0, pad_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        model = OmniASRForCTC(config).to(dtype)
    model.save_pretrained(str(folder))
    synthetic_tokenizer(folder, vocab, {"<|endoftext|>": vocab - 2, "<|im_end|>": vocab - 1})
    del model
    release_memory()
    return folder


def clips(n: int, seconds: float) -> list[np.ndarray]:
    """Speech-like noise: a different clip per request, loud and quiet stretches at a syllable rate."""
    out = []
    for i in range(n):
        g = np.random.default_rng(1000 + i)
        t = np.arange(int(seconds * RATE)) / RATE
        envelope = 0.05 + 0.3 * np.abs(np.sin(2 * np.pi * (3 + i % 5) * t / 2))
        out.append((g.standard_normal(t.size) * envelope).clip(-1, 1).astype(np.float32))
    return out


def wav(wave: np.ndarray) -> bytes:
    from triton_omni.media.audio import pcm_bytes

    data = pcm_bytes(wave)
    header = (b"RIFF" + (36 + len(data)).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
              + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + RATE.to_bytes(4, "little")
              + (2 * RATE).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
              + b"data" + len(data).to_bytes(4, "little"))
    return header + data


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --- modes: each returns go(c) -> (wall, [{"first", "latency"} per request]), and close() -------------
def server_mode(ctx):
    from triton_omni.client.tensors import text
    from triton_omni.client.transcribe import TranscribeClient

    server = start_server("omniasr_ctc", ctx.folder, ctx.overrides, Path(ctx.args.workdir), ctx.target)
    client = TranscribeClient(server.grpc_url, timeout_s=600)

    def one(i, t0):
        first = None
        for out in client.responses("omniasr_ctc", ctx.files[i % len(ctx.files)]):
            first = first or (time.perf_counter() if text(out, "text") else None)
        end = time.perf_counter()
        return {"first": (first or end) - t0, "latency": end - t0}

    def go(c):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            per = list(pool.map(lambda i: one(i, t0), range(c)))
        return time.perf_counter() - t0, per

    return go, server.stop


def build_steps(ctx, model: str = "omniasr_ctc") -> dict:
    from triton_omni.converters.__main__ import load_configs
    from triton_omni.runtime.params import parse_params
    from triton_omni.runtime.step import StepContext

    cfg = load_configs([model], [f"{model}={ctx.folder}"], ctx.overrides)[0]
    return {s.key: s.cls(StepContext(model_name=cfg.model_name(s), max_batch_size=cfg.max_batch_size, base_dir=ROOT,
                                     params=parse_params(s.cls.Params, cfg.resolved_parameters(s, ctx.target)),
                                     device=ctx.device if s.kind == "gpu" else "cpu"))
            for s in cfg.steps}


def ok(values):
    for v in values:
        if isinstance(v, BaseException):
            raise v
    return values


def inprocess_mode(ctx):
    steps = build_steps(ctx)

    def go(c):
        t0 = time.perf_counter()
        pre = [ok(steps["pre"].execute([Request({"audio": np.array([ctx.files[i % len(ctx.files)]], dtype=object)})]))[0]
               for i in range(c)]
        frames = ok(steps["encoder"].execute([Request(p) for p in pre]))
        texts = ok(steps["post"].execute([Request({**p, **f}) for p, f in zip(pre, frames)]))
        assert len(texts) == c
        wall = time.perf_counter() - t0
        return wall, [{"first": wall, "latency": wall}] * c

    return go, lambda: steps["encoder"].close()


def baseline_mode(ctx):
    from transformers import AutoTokenizer, OmniASRForCTC
    from transformers.models.omniasr.feature_extraction_omniasr import OmniASRFeatureExtractor

    from triton_omni.media.audio import decode

    model = OmniASRForCTC.from_pretrained(str(ctx.folder), dtype=ctx.dtype, attn_implementation=ctx.args.hf_attention)
    model = model.to(ctx.device).eval()
    fe, tokenizer = OmniASRFeatureExtractor(), AutoTokenizer.from_pretrained(str(ctx.folder))

    @torch.inference_mode()
    def go(c):
        t0 = time.perf_counter()
        waves = [decode(ctx.files[i % len(ctx.files)], RATE)[0] for i in range(c)]
        inputs = fe(waves, sampling_rate=RATE).to(ctx.device)
        inputs["input_values"] = inputs["input_values"].to(ctx.dtype)
        ids = model.generate(**inputs)
        texts = tokenizer.batch_decode(ids.cpu().tolist(), skip_special_tokens=True)
        sync()
        wall = time.perf_counter() - t0
        assert len(texts) == c
        return wall, [{"first": wall, "latency": wall}] * c

    return go, lambda: None


MODE_FNS = {"server": server_mode, "inprocess": inprocess_mode, "baseline": baseline_mode}


# --- results ----------------------------------------------------------------------------------------
def summarize(model, mode, c, seconds, rounds) -> dict:
    per = [r for _, p in rounds for r in p]
    first, lat = [r["first"] for r in per], [r["latency"] for r in per]
    return {"model": model, "mode": mode, "concurrency": c, "requests": len(per), "audio_s": seconds,
            "rtfx": c * seconds * len(rounds) / sum(w for w, _ in rounds),
            "latency_ms_p50": 1e3 * statistics.median(lat), "latency_ms_p90": 1e3 * percentile(lat, 0.9),
            "first_text_ms_p50": 1e3 * statistics.median(first)}


def intro(data) -> list[str]:
    return [f"Random weights in the released shapes; {data['seconds']:g}-second clips (16 kHz mono WAV), c requests "
            "sent together. RTFx: audio seconds transcribed per wall second. First text: request sent -> its first "
            "response with text (a CTC model answers once: its latency; Qwen3-ASR streams: its first token). Baselines, "
            "eager (no compile), one padded batch of the c clips: transformers OmniASRForCTC; Qwen3ASRForConditionalGeneration"
            f".generate, greedy, {data.get('tokens', 128)} new tokens a request (as every Qwen3-ASR row)."]


def against_baseline(rows, data) -> list[str]:
    by = {(r["model"], r["mode"], r["concurrency"]): r for r in rows}
    ratios = [f"- {m} c={c}: {mode} {r['rtfx'] / by[(m, 'baseline', c)]['rtfx']:.2f}x the baseline's RTFx"
              for (m, mode, c), r in by.items() if mode != "baseline" and (m, "baseline", c) in by]
    return (["Against the baseline:", "", *ratios, ""] if ratios else []) + [
        "Targets: CTC-300M served RTFx >= 5,000 at c=32 and >= 2x transformers batched in-process; Qwen3-ASR >= 3x "
        "transformers `generate` at c=32. Qwen3-ASR rows decode `tokens` tokens a request in every mode (its first "
        "text at c=1 is the time to the first streamed token)."]


PAGE = results.Page(
    title="Speech recognition benchmark", module="perf_analyzer_configs.benchmarks.bench_asr", intro=intro,
    after=against_baseline,
    columns=[results.column("model", "model", numeric=False), results.column("mode", "mode", numeric=False),
             results.column("c", "concurrency"), results.column("requests", "requests"),
             results.column("RTFx", "rtfx", ".0f"), results.column("latency p50 ms", "latency_ms_p50", ".1f"),
             results.column("latency p90 ms", "latency_ms_p90", ".1f"),
             results.column("first text p50 ms", "first_text_ms_p50", ".1f")],
    order=lambda r: (r["model"], MODES.index(r["mode"]), r["concurrency"]))


def write_results(rows, path: Path, args, gpu=None, run_versions=None, date=None, notes=()):
    meta = {"gpu": gpu or device_name(), "seconds": args.seconds, "tokens": args.tokens,
            "versions": run_versions or versions("transformers", "tritonclient", "nvidia-pytriton")}
    results.write(path, PAGE, rows, meta, notes, date)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["omniasr_ctc", "qwen3_asr"], choices=["omniasr_ctc", "qwen3_asr"])
    ap.add_argument("--shapes", nargs="+", default=["300m", "1b"], choices=list(SHAPES), help="omniasr_ctc's")
    ap.add_argument("--qwen3-shapes", nargs="+", default=["1.7b"], choices=["1.7b", "tiny"], help="qwen3_asr's")
    ap.add_argument("--tokens", type=int, default=128, help="tokens Qwen3-ASR decodes per request")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=5, help="rounds of c requests per row")
    ap.add_argument("--seconds", type=float, default=30.0, help="audio per request")
    ap.add_argument("--hf-attention", default="sdpa", help="the baseline's attn_implementation")
    ap.add_argument("--workdir", default="/tmp/triton-omni-bench-asr")
    ap.add_argument("--out", type=Path, default=results.RESULTS / "asr.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shape, c 1 2, one round, 4 s clips: checks the script")
    ap.add_argument("--merge", nargs="+", type=Path, help="combine the results of separate runs into --out")
    ap.add_argument("--note", action="append", default=[], help="a note for the results")
    ap.add_argument("--set", action="append", default=[], help="a converter override for server / inprocess")
    args = ap.parse_args()
    if args.merge:
        parts, rows, notes = results.merge_parts(args.merge, ("model", "mode", "concurrency"), args.note)
        args.seconds = parts[0]["seconds"]
        write_results(rows, args.out, args, parts[0]["gpu"], parts[0]["versions"], max(p["date"] for p in parts), notes)
        print(args.out.with_suffix(".md").read_text())
        return 0
    if args.smoke:
        args.shapes, args.qwen3_shapes, args.concurrency, args.repeats, args.seconds = ["tiny"], ["tiny"], [1, 2], 1, 4.0
        args.tokens = min(args.tokens, 8)
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)        # a CPU check shares its cores (as bench_image.py)
    device, dtype = ("cuda:0", torch.bfloat16) if cuda else ("cpu", torch.float32)
    files = [wav(w) for w in clips(max(args.concurrency), args.seconds)]
    rows = []
    runs = [("omniasr_ctc", shape) for shape in args.shapes if "omniasr_ctc" in args.models]
    runs += [("qwen3_asr", shape) for shape in args.qwen3_shapes if "qwen3_asr" in args.models]
    for model, shape in runs:
        root = Path(args.workdir) / "checkpoints"
        if model == "qwen3_asr":
            from perf_analyzer_configs.benchmarks import asr_qwen3

            folder, fns = asr_qwen3.write_checkpoint(root, shape, device, dtype), asr_qwen3.MODE_FNS
            sets = asr_qwen3.overrides(args.tokens, max(args.concurrency))
        else:
            folder, fns = write_checkpoint(root, shape, device, dtype), MODE_FNS
            sets = ["omniasr_ctc.pre.segmentation=window", f"omniasr_ctc.max_batch_size={max(32, max(args.concurrency))}"]
        ctx = argparse.Namespace(args=args, folder=folder, device=device, dtype=dtype, files=files,
                                 target="gpu" if cuda else "cpu",
                                 overrides=[*sets, *[o for o in args.set if o.startswith(model + ".")]])
        name = f"{model}_{shape}"
        for mode in [m for m in MODES if m in args.modes]:
            t = time.perf_counter()
            go, close = fns[mode](ctx)
            print(f"{name} {mode}: ready in {time.perf_counter() - t:.0f} s", flush=True)
            try:
                go(1)                                       # warm-up: one request, then the largest round
                go(max(args.concurrency))
                for c in args.concurrency:
                    rows.append(summarize(name, mode, c, args.seconds, [go(c) for _ in range(args.repeats)]))
                    print(json.dumps(rows[-1]), flush=True)
                    write_results(rows, args.out, args, notes=args.note)    # after every row: a timeout keeps it
            finally:
                close()
                del go, close
                release_memory()
    write_results(rows, args.out, args, notes=args.note)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
