"""Summarise the AR engine's step trace, wave by wave: when the requests reached the engine, the
prefill steps that took them in, and the decode steps until the wave ended.

    TRITON_OMNI_ENGINE_TRACE=/tmp/trace.jsonl python -m perf_analyzer_configs.benchmarks.bench_ar_decode ...
    python -m perf_analyzer_configs.trace.engine_trace /tmp/trace.jsonl [--concurrency 64]

The bench writes each wave's start and TTFTs to FILE.waves (its clock is the engine's: one machine).
Times are ms from the wave's first send (server) or first add (in-process).
"""
from __future__ import annotations

import argparse
import json
import statistics


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize_wave(wave: dict, steps: list[dict]) -> str:
    t0, end = wave["t0"], wave["t0"] + wave["wall_s"]
    mine = [s for s in steps if t0 - 0.001 <= s["t"] <= end]
    ms = lambda t: 1e3 * (t - t0)   # noqa: E731
    arrivals = sorted(a for s in mine for a in s["arrivals"])
    prefills = [s for s in mine if s["kind"] == "prefill"]
    decodes = [s for s in mine if s["kind"] == "decode"]
    last_prefill = prefills[-1]["t"] if prefills else t0
    ttft = wave["ttft_ms"]
    lines = [f"{wave['mode']} c={wave['concurrency']}: wall {1e3 * wave['wall_s']:.1f} ms, TTFT min/p50/max "
             f"{ttft[0]:.1f} / {statistics.median(ttft):.1f} / {ttft[-1]:.1f} ms"
             + (f"; requests sent by {wave['sent_ms']:.1f} ms" if "sent_ms" in wave else "")]
    if arrivals:
        lines.append(f"  {len(arrivals)} arrivals at the engine from {ms(arrivals[0]):.1f} to {ms(arrivals[-1]):.1f} ms")
    for s in prefills:
        lines.append(f"  prefill at {ms(s['t']):7.1f} ms: {s['rows']:3d} prompts, {s['tokens']:6d} tokens, "
                     f"launch {s['launch_ms']:.1f} ms, collect {s['collect_ms']:.1f} ms")
    early = [s for s in decodes if s["t"] < last_prefill]
    late = [s for s in decodes if s["t"] >= last_prefill]
    gaps = [1e3 * (b["t"] - a["t"]) for a, b in zip(late, late[1:])]
    lines.append(f"  decode steps: {len(early)} before the last prefill, {len(late)} after"
                 + (f" (first at {ms(late[0]['t']):.1f} ms, step-to-step p50 {statistics.median(gaps):.3f} ms,"
                    f" launch p50 {statistics.median(s['launch_ms'] for s in late):.3f} ms)" if len(gaps) > 1 else ""))
    if mine:
        lines.append(f"  last step started at {ms(mine[-1]['t']):.1f} ms; idle steps {sum(s['kind'] == 'idle' for s in mine)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--concurrency", type=int, nargs="*", help="only waves of these concurrencies")
    args = ap.parse_args()
    steps = load(args.trace)
    for wave in load(args.trace + ".waves"):
        if not args.concurrency or wave["concurrency"] in args.concurrency:
            print(summarize_wave(wave, steps))


if __name__ == "__main__":
    main()
