"""What the chat features cost or save, our AR engine in-process, real-size shapes with random bf16
weights, each against its baseline in the same run:

- prefix caching: a 2,048-token shared system prompt + 64-token user turns at c=32 (the system prompt
  cached by one earlier request): TTFT p50 with the cache vs without (target: >= 5x lower);
- structured output: c=32 decode throughput with every row under a grammar (a regex whose mask the
  host computes each step) vs free rows (target: <= 10% slower);
- n=8 samples of a 2,048-token prompt: its prompt prefilled once, TTFT (all 8 first tokens) vs n=1
  (target: within 1.2x).

    python -m perf_analyzer_configs.benchmarks.bench_chat_features            # on the GPU machine
    python -m perf_analyzer_configs.benchmarks.bench_chat_features --smoke    # tiny shape on the CPU

Needs xgrammar and apache-tvm-ffi on the GPU machine (carried wheels), no tritonserver. Writes
perf_analyzer_configs/results/chat_features.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks.ar_checkpoints import SHAPES, write_checkpoint
from perf_analyzer_configs.benchmarks.common import device_name, release_memory, versions

RESULTS = results.RESULTS / "chat_features.json"


def build(folder, args, device, **overrides):
    from triton_omni.ar.engine import EngineThread
    from triton_omni.ar.step import ARParams, build_engine

    params = ARParams(dtype=args.dtype, max_num_seqs=max(32, args.n), load_format="dummy",
                      max_model_len=args.system_len + args.turn_len + args.output_len + 64,
                      max_num_batched_tokens=args.batched_tokens)
    for k, v in overrides.items():
        setattr(params, k, v)
    engine, tokenizer = build_engine(folder, params, device)
    return engine, EngineThread(engine), tokenizer


def wave(engine, prompts, params_list):
    """Add every prompt at once; per request the time its last sample got its first token, and the
    number of tokens all of them got."""
    done, left = threading.Event(), [sum(sp.n for sp in params_list)]
    stamps: dict[int, dict[int, list[float]]] = {}
    lock = threading.Lock()

    def on_output(seq, new, reason):
        now = time.perf_counter()
        with lock:
            if new:
                stamps.setdefault(id(seq.parent or seq), {}).setdefault(seq.index, []).append(now)
            if reason is not None:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

    t0 = time.perf_counter()
    seqs = [engine.add(p, sp, on_output) for p, sp in zip(prompts, params_list)]
    assert done.wait(900), "the wave did not finish"
    wall = time.perf_counter() - t0
    ttft = [max(s[0] for s in stamps[id(q)].values()) - t0 for q in seqs]
    tokens = sum(len(x) for q in seqs for x in stamps[id(q)].values())
    return wall, ttft, tokens


def ids(rng, n: int, args) -> list[int]:
    return [rng.randrange(256, SHAPES[args.model]["vocab_size"] - 1000) for _ in range(n)]


def bench_prefix(folder, args, device) -> list[dict]:
    from triton_omni.ar.sampling import SamplingParams

    rng = random.Random(0)
    system = ids(rng, args.system_len, args)
    sp = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
    rows = []
    for cached in (False, True):
        engine, loop, _ = build(folder, args, device, enable_prefix_caching=cached)
        wave(engine, [system + [7] * args.turn_len], [sp])                   # warm-up: the system prompt cached
        ttfts = []
        for _ in range(args.waves):
            turns = [system + ids(rng, args.turn_len, args) for _ in range(args.concurrency)]
            _, ttft, _ = wave(engine, turns, [sp] * len(turns))
            ttfts += ttft
        rows.append({"bench": "prefix caching", "mode": "cache on" if cached else "cache off",
                     "concurrency": args.concurrency, "ttft_ms_p50": 1e3 * statistics.median(ttfts),
                     "hit_rate": engine.stats.prefix_cache_hit_rate, "prefill_tokens": engine.stats.prefill_tokens})
        print(json.dumps(rows[-1]), flush=True)
        loop.stop()
        del engine
        release_memory()
    return rows


def bench_structured(folder, args, device) -> list[dict]:
    from triton_omni.ar.sampling import SamplingParams

    rng = random.Random(1)
    engine, loop, _ = build(folder, args, device)
    prompts = [ids(rng, args.turn_len, args) for _ in range(args.concurrency)]
    rows = []
    for guided in (None, {"regex": "[a-z ,.]+"}):
        sp = SamplingParams(max_tokens=args.decode_len, temperature=1.0, seed=3, ignore_eos=True, guided_decoding=guided)
        wave(engine, prompts[:2], [sp] * 2)                                   # warm-up (graphs of these features)
        walls = []
        for _ in range(args.waves):
            wall, ttft, tokens = wave(engine, prompts, [sp] * len(prompts))
            walls.append(tokens / (wall - statistics.median(ttft)))
        rows.append({"bench": "structured output", "mode": "grammar (regex) on every row" if guided else "free rows",
                     "concurrency": args.concurrency, "tokens_per_s": statistics.median(walls)})
        print(json.dumps(rows[-1]), flush=True)
    loop.stop()
    return rows


def bench_n(folder, args, device) -> list[dict]:
    from triton_omni.ar.sampling import SamplingParams

    rng = random.Random(2)
    engine, loop, _ = build(folder, args, device)
    rows = []
    for n in (1, args.n):
        sp = SamplingParams(max_tokens=args.output_len, temperature=1.0, seed=5, n=n, ignore_eos=True)
        wave(engine, [ids(rng, args.system_len, args)], [sp])    # warm-up
        before = engine.stats.prefill_tokens
        ttfts = []
        for _ in range(args.waves):
            prompt = ids(rng, args.system_len, args)
            _, ttft, _ = wave(engine, [prompt], [sp])
            ttfts += ttft
        rows.append({"bench": "n samples", "mode": f"n={n}", "concurrency": 1,
                     "ttft_ms_p50": 1e3 * statistics.median(ttfts),
                     "prefill_tokens_per_request": (engine.stats.prefill_tokens - before) / args.waves})
        print(json.dumps(rows[-1]), flush=True)
    loop.stop()
    return rows


def ratio_lines(rows, data) -> list[str]:
    def get(bench, mode, key):
        return next((r[key] for r in rows if r["bench"] == bench and r["mode"] == mode), None)

    out = []
    off, on = get("prefix caching", "cache off", "ttft_ms_p50"), get("prefix caching", "cache on", "ttft_ms_p50")
    if off and on:
        out.append(f"Prefix caching: TTFT p50 {off / on:.1f}x lower with the cache (target >= 5x).")
    free = get("structured output", "free rows", "tokens_per_s")
    bound = get("structured output", "grammar (regex) on every row", "tokens_per_s")
    if free and bound:
        out.append(f"Structured output: {100 * (1 - bound / free):.1f}% lower decode throughput (target <= 10%).")
    n1 = get("n samples", "n=1", "ttft_ms_p50")
    nk = next((r for r in rows if r["bench"] == "n samples" and r["mode"] != "n=1"), None)
    if n1 and nk:
        out.append(f"{nk['mode']}: TTFT {nk['ttft_ms_p50'] / n1:.2f}x that of n=1 (target <= 1.2x), "
                   f"{nk['prefill_tokens_per_request']:.0f} prompt tokens prefilled per request.")
    return out


PAGE = results.Page(
    title="Chat features: prefix caching, structured output, n samples", module="perf_analyzer_configs.benchmarks.bench_chat_features",
    intro=lambda d: [f"{d['model']}, {d['dtype']}, random weights, in-process engine. System prompt {d['system_len']} "
                     f"tokens, user turns {d['turn_len']}, {d['output_len']} output tokens (structured: {d['decode_len']})."],
    after=ratio_lines,
    columns=[results.column("bench", "bench", numeric=False), results.column("mode", "mode", numeric=False),
             results.column("concurrency", "concurrency"), results.column("TTFT p50 ms", "ttft_ms_p50", ".1f"),
             results.column("tokens/s", "tokens_per_s", ".0f"), results.column("prefix hit rate", "hit_rate", ".2f"),
             results.column("prefilled tokens / request", "prefill_tokens_per_request", ".0f")])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--benches", nargs="+", default=["prefix", "structured", "n"], choices=["prefix", "structured", "n"])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--system-len", type=int, default=2048)
    ap.add_argument("--turn-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--decode-len", type=int, default=256, help="output tokens of the structured-output runs")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--batched-tokens", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--workdir", default="/tmp/triton-omni-bench")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU, to check the script")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.concurrency, args.system_len, args.turn_len, args.output_len = "tiny", 4, 64, 8, 4
        args.decode_len, args.n, args.waves, args.dtype = 8, 3, 1, "float32"
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    folder = write_checkpoint(args.model, Path(args.workdir) / "checkpoints")
    rows = []
    for bench in args.benches:
        rows += {"prefix": bench_prefix, "structured": bench_structured, "n": bench_n}[bench](folder, args, device)
        meta = {"gpu": device_name(), "versions": versions("transformers", "triton", "xgrammar"), "model": args.model,
                "dtype": args.dtype, "system_len": args.system_len, "turn_len": args.turn_len,
                "output_len": args.output_len, "decode_len": args.decode_len}
        results.write(args.out, PAGE, rows, meta)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
