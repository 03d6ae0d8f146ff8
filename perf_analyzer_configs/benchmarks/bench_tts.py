"""Speech synthesis benchmark: time to first audio (TTFA), real-time factor (RTF) and audio seconds per
second of our TTS ensembles behind tritonserver (gRPC streaming), of their steps called in-process, and
of the reference code (baseline), on the released shapes with random weights, in one run on one GPU.

    python -m perf_analyzer_configs.benchmarks.bench_tts                         # on the GPU machine
    python -m perf_analyzer_configs.benchmarks.bench_tts --smoke --out /tmp/tts_smoke.json   # tiny shapes, CPU check
    python -m perf_analyzer_configs.benchmarks.bench_tts --models kokoro_tts --out r2.json   # a part; then --merge r1.json r2.json

orpheus_tts  canopylabs/orpheus-3b-0.1-ft (Llama-3.2-3B talker) + hubertsiuzdak/snac_24khz. baseline: transformers
             LlamaForCausalLM.generate (static cache, a batch of c) + `snac` SNAC.decode of those tokens.
kokoro_tts   hexgrad/Kokoro-82M. baseline: the `kokoro` package's KModel forward, one utterance per call.
qwen3_tts    Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice (28-layer talker + 5-layer code predictor, 16 codebooks at
             12.5 Hz) + its speech tokenizer's decoder. baseline: the `qwen-tts` package's generate_custom_voice
             (c texts in one call) in its own environment (--package-python; transformers 4.57.3), driven
             through perf_analyzer_configs/benchmarks/bench_tts_qwen3_package.py.
inprocess: the ensemble's steps built from ensemble_configs/<model>.yaml with the server's parameters, fed
as Triton batches them. Modes run in the order server, inprocess, baseline: the server's processes free
the GPU when they stop; what in-process leaves fits in the 15% gpu_memory_utilization keeps free.

Workload: a fixed 25-word text (Kokoro: its phonemes, below); Orpheus makes exactly --audio-tokens tokens
(min_tokens = max_tokens, EOS ignored; 616 = 88 SNAC frames = 7.5 s) at the release's temperature 0.6 /
top_p 0.8; Qwen3-TTS exactly --audio-frames frames (100 = 8 s) at the release's sampling (temperature
0.9, top-k 50, repetition penalty 1.05, the code predictor likewise), voice vivian; seeds fixed. Weights are written once under --workdir; every mode loads the same files.
TTFA: request sent -> first non-empty PCM chunk received. Baselines do not stream: Orpheus' TTFA is
generating the tokens of the ensemble's first chunk (2 frames + 3 lookahead) + their SNAC decode;
Kokoro's is the whole utterance; Qwen3-TTS's is generating and decoding the frames of the ensemble's
first chunk (3). RTF: latency / audio seconds. Audio s/s: all requests' audio seconds
/ wall time. c requests at once, --repeats rounds per row after a warm-up (c=1, then the largest c).

Wheels beyond torch / transformers / tritonclient / nvidia-pytriton: `snac` (+ einops; any Orpheus mode:
the codec checkpoint is written by converters/tiny_tts.snac_24khz with it; and the baseline), `kokoro==0.9.4
--no-deps` + `loguru` (+ attrs; Kokoro baseline only). Not PyAV (`av`): streamed responses are raw PCM
(media/audio.pcm_bytes); av is imported only to encode files (wav, mp3, ...), never asked for here.
Not espeak-ng: Kokoro requests carry phonemes. The qwen3_tts baseline's environment: qwen-tts 0.1.1,
transformers 4.57.3, accelerate, huggingface_hub<1 (the package's other imports are stubbed, see
bench_tts_qwen3_package.py); e.g. `pip install --no-deps --target DIR <those wheels>` and
`--package-python "env PYTHONPATH=DIR python3"`.
"""
from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from perf_analyzer_configs import results
from triton_omni.client.progress import bar
from perf_analyzer_configs.benchmarks.common import (ROOT, device_name, percentile, release_memory, start_server,
                                                     versions)
from perf_analyzer_configs.benchmarks.tts_checkpoints import (PHONEMES, SHAPES, TEXT, write_kokoro, write_orpheus,
                                                              write_qwen3_tts)
from triton_omni.runtime.step import Request, ResponseSink, string_array

MODES = ["server", "inprocess", "baseline"]


# --- measuring --------------------------------------------------------------------------------------
def summarize(model, mode, c, rounds) -> dict:
    """rounds: [(wall_s, [{"ttfa", "latency", "audio_s"} per request])]."""
    per = [r for _, p in rounds for r in p]
    ttfa, rtf, lat = ([r["ttfa"] for r in per], [r["latency"] / r["audio_s"] for r in per],
                      [r["latency"] for r in per])
    return {"model": model, "mode": mode, "concurrency": c, "requests": len(per),
            "audio_s": statistics.median(r["audio_s"] for r in per),
            "ttfa_ms_p50": 1e3 * statistics.median(ttfa), "ttfa_ms_p90": 1e3 * percentile(ttfa, 0.9),
            "latency_ms_p50": 1e3 * statistics.median(lat), "rtf_p50": statistics.median(rtf),
            "rtf_p90": percentile(rtf, 0.9),
            "audio_s_per_s": sum(r["audio_s"] for r in per) / sum(w for w, _ in rounds)}


def sampling(ctx, i: int) -> dict:
    if ctx.name == "kokoro_tts":
        return {"seed": 1000 + i}
    n = ctx.args.audio_frames if ctx.name == "qwen3_tts" else ctx.args.audio_tokens
    return {"seed": 1000 + i, "max_tokens": n, "min_tokens": n, "ignore_eos": True}


class Sink(ResponseSink):
    """A decoupled step's responses to `put(outputs, final)`."""

    def __init__(self, put):
        self.send, self.error = put, lambda exc: put(exc, True)


def ok(results):
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


# --- modes: each returns go(c) -> (wall, per-request dicts), and close() ---------------------------
def server_mode(ctx):
    from triton_omni.client.speech import SpeechClient
    from triton_omni.client.tensors import first, text
    from triton_omni.client.triton import responses

    server = start_server(ctx.name, ctx.folder, ctx.overrides, Path(ctx.args.workdir), ctx.target, ctx.args.server_arg)

    def one(i, t0):
        values = SpeechClient.values(TEXT, voice=ctx.voice, response_format="pcm", stream=True,
                                     sampling=sampling(ctx, i))
        if ctx.name == "kokoro_tts":
            values["phonemes"] = (PHONEMES, "BYTES")
        got, nbytes, rate = None, 0, 0
        for out in responses(server.grpc_url, ctx.name, values, 600, last=lambda o: bool(text(o, "finish_reason"))):
            audio = first(out, "audio", b"")
            got = got or (time.perf_counter() if audio else None)
            nbytes, rate = nbytes + len(audio), int(first(out, "sample_rate", 0)) or rate
        return {"ttfa": got - t0, "latency": time.perf_counter() - t0, "audio_s": nbytes / 2 / rate}

    def go(c):                              # c requests at once, each on its own gRPC stream
        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            results = list(pool.map(lambda i: one(i, t0), range(c)))
        return time.perf_counter() - t0, results

    def close():
        try:
            if ctx.args.server_stats:    # where a request's time went, per step (Triton's statistics API)
                print_server_stats(server)
        finally:
            server.stop()

    return go, close


def print_server_stats(server) -> None:
    """Each loaded model's Triton statistics, per execution (STATS lines on stdout)."""
    import urllib.request

    stats = json.loads(urllib.request.urlopen(f"http://{server.http_url}/v2/models/stats").read())
    for m in stats.get("model_stats", []):
        n, s = int(m.get("execution_count", 0)), m["inference_stats"]
        if n:
            print("STATS " + json.dumps({"model": m["name"], "executions": n, "inferences": int(m.get("inference_count", 0)),
                                         **{f"{k}_ms_per_exec": int(s[k]["ns"]) / n / 1e6
                                            for k in ("queue", "compute_input", "compute_infer", "compute_output")}}),
                  flush=True)


def build_steps(ctx) -> tuple[dict, int]:
    """The ensemble's steps, with the parameters the server gives them on this target."""
    from triton_omni.converters.__main__ import load_configs
    from triton_omni.runtime.params import parse_params
    from triton_omni.runtime.step import StepContext

    cfg = load_configs([ctx.name], [f"{ctx.name}={ctx.folder}"], ctx.overrides)[0]
    return {s.key: s.cls(StepContext(model_name=cfg.model_name(s), max_batch_size=cfg.max_batch_size, base_dir=ROOT,
                                     params=parse_params(s.cls.Params, cfg.resolved_parameters(s, ctx.target)),
                                     device=ctx.device if s.kind == "gpu" else "cpu"))
            for s in cfg.steps}, cfg.max_batch_size


def speech_request(ctx, i: int) -> Request:
    tensors = {"text": string_array(TEXT), "voice": string_array(ctx.voice), "response_format": string_array("pcm"),
               "stream": np.array([True]), "sampling_parameters": string_array(json.dumps(sampling(ctx, i)))}
    if ctx.name == "kokoro_tts":
        tensors["phonemes"] = string_array(PHONEMES)
    return Request(tensors, request_id=f"r{i}")


def talker_inprocess(ctx):
    """(Orpheus, Qwen3-TTS) pre -> talker.submit (its engine and delivery threads run on) -> the codec on every queued
    talker response (up to max_batch_size at a time, as Triton's dynamic batcher) -> post."""
    steps, max_batch = build_steps(ctx)
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def go(c):
        first, nbytes, ends, t0 = {}, [0] * c, {}, time.perf_counter()
        for i in range(c):
            x = ok(steps["pre"].execute([speech_request(ctx, i)]))[0]
            sink = Sink(lambda outputs, final=False, i=i: inbox.put((i, outputs, final)))
            steps["talker"].submit(Request({**x, "stream": np.array([True])}, request_id=f"r{i}"), sink)
        while len(ends) < c:
            items = [inbox.get(timeout=600)]
            while len(items) < max_batch and not inbox.empty():
                items.append(inbox.get())
            waves = ok(steps["codec"].execute([Request(ok([o])[0]) for _, o, _ in items]))
            outs = ok(steps["post"].execute([Request(w) for w in waves]))
            now = time.perf_counter()
            for (i, _, final), out in zip(items, outs):
                nbytes[i] += len(out["audio"][0])
                if out["audio"][0]:
                    first.setdefault(i, now)
                if final:
                    ends[i] = now
        return time.perf_counter() - t0, [{"ttfa": first[i] - t0, "latency": ends[i] - t0,
                                           "audio_s": nbytes[i] / 2 / 24000} for i in range(c)]

    return go, steps["talker"].close


def kokoro_inprocess(ctx):
    """pre -> synth (requests in batches of max_batch_size, as Triton queues them) -> chunks -> post."""
    steps, max_batch = build_steps(ctx)

    def go(c):
        per, t0 = [], time.perf_counter()
        for b in range(0, c, max_batch):
            reqs = [speech_request(ctx, i) for i in range(b, min(c, b + max_batch))]
            x = ok(steps["pre"].execute(reqs))
            for w in ok(steps["synth"].execute([Request({**o, **r.tensors}) for o, r in zip(x, reqs)])):
                chunks = []
                steps["chunks"].submit(Request(w), Sink(lambda outputs, final=False: chunks.append(outputs)))
                head = ok(steps["post"].execute([Request(chunks[0])]))
                ttfa = time.perf_counter() - t0
                outs = head + ok(steps["post"].execute([Request(o) for o in chunks[1:]]))
                per.append({"ttfa": ttfa, "latency": time.perf_counter() - t0,
                            "audio_s": sum(len(o["audio"][0]) for o in outs) / 2 / 24000})
        return time.perf_counter() - t0, per

    return go, lambda: None


def orpheus_baseline(ctx):
    from snac import SNAC
    from transformers import LlamaForCausalLM

    from triton_omni.text.tokenizer import load_tokenizer
    from triton_omni.tts.orpheus.talker import chunk_plan
    from triton_omni.tts.orpheus.tokens import OrpheusTokens, frames_to_codes

    tok = load_tokenizer(ctx.folder)
    tokens = OrpheusTokens.from_tokenizer(tok)
    prompt = tokens.prompt(tok, "tara", TEXT)
    model = LlamaForCausalLM.from_pretrained(str(ctx.folder), dtype=ctx.dtype).to(ctx.device).eval()
    snac = SNAC.from_pretrained(str(ctx.codec)).to(ctx.device).eval()
    plan = chunk_plan(ctx.codec, 2, 8)               # orpheus_tts.yaml's first_chunk_frames, chunk_frames
    first_tokens = 7 * (plan.first + plan.right)     # the ensemble's first chunk: 2 frames + lookahead
    static = ctx.device != "cpu"                     # a static cache on the GPU (as bench_ar_decode.py)

    def run(c, n):
        ids = torch.tensor([prompt] * c, device=ctx.device)
        kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=True, temperature=0.6, top_p=0.8, top_k=0,
                      eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(ids))
        kwargs.update(dict(cache_implementation="static", disable_compile=not ctx.args.hf_compile) if static else {})
        torch.manual_seed(1000)
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)[:, len(prompt):]
            codes = frames_to_codes(out.cpu().numpy(), tokens.audio_start, 4096)    # the release's layout
            wave = snac.decode([x.to(ctx.device) for x in codes])
        torch.cuda.synchronize() if ctx.device != "cpu" else None
        assert out.shape[1] == n
        return wave

    def go(c):
        t0 = time.perf_counter()
        run(c, first_tokens)
        ttfa, t0 = time.perf_counter() - t0, time.perf_counter()
        wave = run(c, ctx.args.audio_tokens)
        wall = time.perf_counter() - t0
        return wall, [{"ttfa": ttfa, "latency": wall, "audio_s": wave.shape[-1] / 24000}] * c

    return go, lambda: None


def kokoro_baseline(ctx):
    import importlib.util
    import types

    from triton_omni.tts.kokoro.model import WEIGHTS_FILE, load_voice, lstm_cudnn, voice_style

    if "kokoro" not in sys.modules:      # kokoro/model.py alone: the package's __init__ pulls in misaki, spaCy
        package = types.ModuleType("kokoro")
        package.__path__ = list(importlib.util.find_spec("kokoro").submodule_search_locations)
        sys.modules["kokoro"] = package
    from kokoro.model import KModel
    from loguru import logger

    logger.disable("kokoro")
    device = torch.device(ctx.device)
    with lstm_cudnn(device):     # the same LSTM kernels as ours where cuDNN cannot run LSTMs here
        model = KModel(repo_id="hexgrad/Kokoro-82M", config=str(ctx.folder / "config.json"),
                       model=str(ctx.folder / WEIGHTS_FILE)).to(device).eval()
    def in_lstm_context(forward):
        def run(*args, **kwargs):
            with lstm_cudnn(device):
                return forward(*args, **kwargs)
        return run

    for lstm in [m for m in model.modules() if isinstance(m, torch.nn.LSTM)]:
        lstm.forward = in_lstm_context(lstm.forward)
    style = voice_style(load_voice(ctx.folder / "voices" / "af_heart.pt"), len(PHONEMES))[None]

    def go(c):
        per, t0 = [], time.perf_counter()
        for i in range(c):                            # KModel takes one utterance per call
            torch.manual_seed(1000 + i)
            audio = model(PHONEMES, style, 1.0)       # on the host when it returns
            lat = time.perf_counter() - t0
            per.append({"ttfa": lat, "latency": lat, "audio_s": audio.shape[-1] / 24000})
        return time.perf_counter() - t0, per

    return go, lambda: None


def qwen3_tts_baseline(ctx):
    """The package in its own environment (bench_tts_qwen3_package.py), one round per go(c)."""
    import shlex
    import subprocess

    cmd = [*shlex.split(ctx.args.package_python), str(Path(__file__).with_name("bench_tts_qwen3_package.py")),
           str(ctx.folder), "--device", ctx.device, "--dtype", str(ctx.dtype).replace("torch.", ""),
           "--frames", str(ctx.args.audio_frames), "--first", "3", "--text", TEXT, "--voice", ctx.voice]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def reply() -> dict:
        while True:                          # the package prints notices of its own on stdout: skipped
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the qwen-tts baseline process ended (rc {proc.wait()}); its stderr is above")
            if line.startswith("@@ "):
                return json.loads(line[3:])
            print(f"  [qwen-tts] {line.rstrip()}", file=sys.stderr)

    ready = reply()
    note = (f"qwen3_tts baseline: qwen-tts {ready.get('qwen_tts')} with transformers {ready['transformers']}, "
            f"torch {ready['torch']}" + (f"; stubbed (never called): {', '.join(ready['stubbed'])}" if ready["stubbed"] else ""))
    if note not in ctx.args.note:
        ctx.args.note.append(note)
    print(note, flush=True)

    def go(c):
        proc.stdin.write(json.dumps({"c": c, "seed": 1000}) + "\n")
        proc.stdin.flush()
        r = reply()
        return r["wall"], [{"ttfa": r["ttfa"], "latency": r["wall"], "audio_s": a} for a in r["audio_s"]]

    def close():
        proc.stdin.close()
        proc.wait(timeout=60)

    return go, close


MODE_FNS = {("orpheus_tts", "baseline"): orpheus_baseline, ("orpheus_tts", "inprocess"): talker_inprocess,
            ("orpheus_tts", "server"): server_mode, ("kokoro_tts", "baseline"): kokoro_baseline,
            ("kokoro_tts", "inprocess"): kokoro_inprocess, ("kokoro_tts", "server"): server_mode,
            ("qwen3_tts", "baseline"): qwen3_tts_baseline, ("qwen3_tts", "inprocess"): talker_inprocess,
            ("qwen3_tts", "server"): server_mode}


# --- results ----------------------------------------------------------------------------------------
MODELS = ["orpheus_tts", "kokoro_tts", "qwen3_tts"]


def write_results(rows, path: Path, args, gpu=None, run_versions=None, date=None, notes=()):
    meta = {"gpu": gpu or device_name(),
            "versions": run_versions or versions("transformers", "snac", "kokoro", "tritonclient", "nvidia-pytriton"),
            "text": TEXT, "phonemes": PHONEMES, "audio_tokens": args.audio_tokens, "audio_frames": args.audio_frames}
    results.write(path, PAGE, rows, meta, notes, date)


def intro(data) -> list[str]:
    return [f"Random weights in the released shapes. Text: \"{data['text']}\" (Kokoro: its phonemes). Orpheus: "
            f"{data['audio_tokens']} audio tokens per request, Qwen3-TTS {data['audio_frames']} frames (EOS ignored). "
            "TTFA: request sent -> first PCM chunk received (baselines: see the script's docstring). RTF: latency / "
            "audio seconds. c requests sent together; p50/p90 over all requests of the repeats."]


def against_baseline(rows, data) -> list[str]:
    by = {(r["model"], r["mode"], r["concurrency"]): r for r in rows}
    ratios = [f"- {m} c={c}: {mode} {r['audio_s_per_s'] / by[(m, 'baseline', c)]['audio_s_per_s']:.2f}x the "
              "baseline's audio s/s" for (m, mode, c), r in by.items()
              if mode != "baseline" and (m, "baseline", c) in by]
    return (["Throughput against the baseline:", "", *ratios, ""] if ratios else []) + [
        "Qwen3-TTS-0.6B targets: TTFA p50 <= 50 ms at c=1, <= 150 ms at c=16; >= 3x the qwen-tts package's "
        "audio s/s at c=16."]


PAGE = results.Page(
    title="Speech synthesis benchmark", module="perf_analyzer_configs.benchmarks.bench_tts", intro=intro,
    after=against_baseline,
    columns=[results.column("model", "model", numeric=False), results.column("mode", "mode", numeric=False),
             results.column("c", "concurrency"), results.column("requests", "requests"),
             results.column("audio s", "audio_s", ".2f"), results.column("TTFA p50 ms", "ttfa_ms_p50", ".1f"),
             results.column("TTFA p90 ms", "ttfa_ms_p90", ".1f"), results.column("RTF p50", "rtf_p50", ".4f"),
             results.column("RTF p90", "rtf_p90", ".4f"), results.column("audio s/s", "audio_s_per_s", ".1f")],
    order=lambda r: (MODELS.index(r["model"]), MODES.index(r["mode"]), r["concurrency"]),
    plot=results.Plot(panels=[("audio_s_per_s", "audio s/s"), ("ttfa_ms_p50", "TTFA p50 (ms)"), ("rtf_p50", "RTF p50")]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["orpheus_tts", "kokoro_tts"], choices=MODELS)
    ap.add_argument("--audio-frames", type=int, default=100, help="Qwen3-TTS frames per request (12.5 a second)")
    ap.add_argument("--package-python", default=str(ROOT / ".venv-qwentts" / "bin" / "python"),
                    help="the command that runs python in the qwen-tts environment (the qwen3_tts baseline)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=3, help="rounds of c requests per row")
    ap.add_argument("--audio-tokens", type=int, default=7 * 88, help="Orpheus tokens per request (7 per frame)")
    ap.add_argument("--shapes", default="real", choices=list(SHAPES), help="tiny: seconds on a CPU")
    ap.add_argument("--hf-compile", action="store_true", help="let transformers compile its static-cache decode")
    ap.add_argument("--workdir", default="/tmp/triton-omni-bench-tts")
    ap.add_argument("--out", type=Path, default=results.RESULTS / "tts.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, c 1 2, one round, 84 tokens: checks the script")
    ap.add_argument("--merge", nargs="+", type=Path, help="combine the results of separate runs into --out")
    ap.add_argument("--note", action="append", default=[], help="a note for the results")
    ap.add_argument("--set", action="append", default=[], help="a converter override for the server mode (KEY=VALUE)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="an extra tritonserver argument for the server mode, e.g. --server-arg=--trace-config=rate=1")
    ap.add_argument("--server-stats", action="store_true", help="print each served step's Triton statistics at the end")
    args = ap.parse_args()
    if args.merge:
        parts, rows, notes = results.merge_parts(args.merge, ("model", "mode", "concurrency"), args.note)
        args.audio_tokens = parts[0]["audio_tokens"]
        args.audio_frames = next((p["audio_frames"] for p in parts if "audio_frames" in p), args.audio_frames)
        write_results(rows, args.out, args, parts[0]["gpu"], parts[0]["versions"],
                      max(p["date"] for p in parts), notes)
        print(args.out.with_suffix(".md").read_text())
        return 0
    if args.smoke:
        args.shapes, args.concurrency, args.repeats, args.audio_tokens, args.audio_frames = "tiny", [1, 2], 1, 7 * 12, 12
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)   # a CPU check shares its cores (as bench_image.py)
    device, dtype = ("cuda:0", torch.bfloat16) if cuda else ("cpu", torch.float32)
    root, rows = Path(args.workdir) / "checkpoints", []
    for name in bar(args.models, desc="models", unit="model"):
        ctx = argparse.Namespace(name=name, args=args, device=device, dtype=dtype, target="gpu" if cuda else "cpu",
                                 voice={"kokoro_tts": "af_heart", "qwen3_tts": "vivian"}.get(name, "tara"),
                                 overrides=[])
        if name == "qwen3_tts":
            ctx.folder = write_qwen3_tts(root, args.shapes, device, dtype)
            if max(args.concurrency) > (64 if cuda else 8):          # the ensemble's talker max_num_seqs
                ctx.overrides.append(f"{name}.talker.max_num_seqs={max(args.concurrency)}")
        elif name == "orpheus_tts":
            ctx.folder, ctx.codec = write_orpheus(root, args.shapes, device, dtype)
            ctx.overrides = [f"{name}.codec_checkpoint={ctx.codec}"]
            if max(args.concurrency) > (64 if cuda else 8):          # the ensemble's talker max_num_seqs
                ctx.overrides.append(f"{name}.talker.max_num_seqs={max(args.concurrency)}")
        else:
            ctx.folder = write_kokoro(root, args.shapes)
        ctx.overrides += args.set
        for mode in [m for m in MODES if m in args.modes]:
            t = time.perf_counter()
            go, close = MODE_FNS[(name, mode)](ctx)
            print(f"{name} {mode}: ready in {time.perf_counter() - t:.0f} s", flush=True)
            try:
                go(1)                                       # warm-up: one request, then the largest round
                go(max(args.concurrency))
                for c in args.concurrency:
                    rows.append(summarize(name, mode, c, [go(c) for _ in range(args.repeats)]))
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
