"""Where a burst of requests spends its time inside tritonserver, per ensemble step, from Triton's own
trace (TIMESTAMPS level). Requests whose starts lie closer than --wave-gap-ms form a wave (e.g. one
c=64 wave of the AR decode benchmark); for each wave and step: when its requests were queued, when their
execute started and ended (a decoupled step's execute ends once it has taken the request in), in ms
from the wave's first request, min / p50 / max. For a step that runs several times per request (a
detokenizer after each streamed response) only its first run per request counts: the first token.
Then each step's executes in order, as requests x [start-end] ms: requests that shared an execute
(Triton's dynamic batcher) share its start. That is what shows a step taking a burst in batches that
grow while it works, or one request at a time.

    python -m perf_analyzer_configs.benchmarks.bench_ar_decode --models qwen3-0.6b --modes server --concurrency 64 64 \\
        --server-model qwen3_chat_ensemble --server-arg=--trace-config=triton,file=/tmp/trace.json \\
        --server-arg=--trace-config=triton,log-frequency=200 --server-arg=--trace-config=rate=1 \\
        --server-arg=--trace-config=level=TIMESTAMPS
    python -m perf_analyzer_configs.trace.triton_trace /tmp/trace.json.*

With log-frequency=0 Triton writes the trace only when it exits, which a server stopped by the
benchmark may not reach (it wrote no file in one GPU run); 200 writes numbered files as it goes.

Triton traces the steps of an ensemble called by a client; it does not trace the calls a python model
(the streaming front) makes, so call the ensemble itself to see its steps.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

MARKS = ("QUEUE_START", "COMPUTE_START", "COMPUTE_END")


def load(*paths: Path) -> dict[int, dict]:
    """trace id -> {model_name, parent_id, ts: {name: first ns}}. Triton writes a trace in pieces, and
    with log-frequency N > 0 into files FILE.0, FILE.1, ...: give them all."""
    traces: dict[int, dict] = defaultdict(lambda: {"ts": {}})
    for entry in (e for path in paths for e in json.loads(path.read_text())):
        t = traces[entry["id"]]
        for key, value in entry.items():
            if key == "timestamps":
                for stamp in value:
                    t["ts"].setdefault(stamp["name"], stamp["ns"])
            elif key != "id":
                t[key] = value
    return dict(traces)


def waves(traces: dict[int, dict], gap_ms: float) -> list[list[int]]:
    """Top-level requests (no parent) grouped by start: a new wave after a gap of more than gap_ms."""
    tops = sorted((t["ts"]["REQUEST_START"], i) for i, t in traces.items()
                  if "parent_id" not in t and "REQUEST_START" in t["ts"])
    out: list[list[int]] = []
    last = None
    for start, i in tops:
        if last is None or start - last > gap_ms * 1e6:
            out.append([])
        out[-1].append(i)
        last = start
    return out


def spread(values: list[float]) -> str:
    return f"{min(values):7.1f} / {statistics.median(values):7.1f} / {max(values):7.1f}"


def summarize_wave(traces: dict[int, dict], wave: list[int]) -> list[str]:
    t0 = min(traces[i]["ts"]["REQUEST_START"] for i in wave)
    ms = lambda ns: (ns - t0) / 1e6  # noqa: E731
    first_child: dict[tuple[str, int], dict] = {}        # (model, parent) -> its earliest trace
    members = set(wave)
    for t in traces.values():
        parent = t.get("parent_id")
        if parent in members and "QUEUE_START" in t["ts"]:
            key = (t["model_name"], parent)
            if key not in first_child or t["ts"]["QUEUE_START"] < first_child[key]["ts"]["QUEUE_START"]:
                first_child[key] = t
    top = traces[wave[0]]["model_name"]
    lines = [f"wave of {len(wave)} requests to {top}: ms from its first request, min / p50 / max",
             f"  {'requests start':<34} {spread([ms(traces[i]['ts']['REQUEST_START']) for i in wave])}"]
    by_model: dict[str, list[dict]] = defaultdict(list)
    for (model, _), t in first_child.items():
        by_model[model].append(t)
    steps = sorted(by_model.items(), key=lambda kv: min(t["ts"]["QUEUE_START"] for t in kv[1]))   # first queued first
    for model, ts in steps:
        for mark in MARKS:
            values = [ms(t["ts"][mark]) for t in ts if mark in t["ts"]]
            if values:
                lines.append(f"  {model + ' ' + mark.lower():<34} {spread(values)}  ({len(values)})")
    for model, ts in steps:
        lines.append(f"  {model} executes: {executes(ts, ms)}")
    sent = [ms(traces[i]["ts"]["GRPC_SEND_START"]) for i in wave if "GRPC_SEND_START" in traces[i]["ts"]]
    if sent:
        lines.append(f"  {'first response sent':<34} {spread(sent)}")
    return lines


def executes(ts: list[dict], ms) -> str:
    """`requests x [start-end]` per execute, in order of start (requests of one batch share it)."""
    runs: dict[int, list[dict]] = defaultdict(list)
    for t in ts:
        if "COMPUTE_START" in t["ts"]:
            runs[t["ts"]["COMPUTE_START"]].append(t)
    return " ".join(f"{len(group)}x[{ms(start):.1f}-{ms(max(t['ts'].get('COMPUTE_END', start) for t in group)):.1f}]"
                    for start, group in sorted(runs.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, nargs="+")
    ap.add_argument("--wave-gap-ms", type=float, default=50.0)
    ap.add_argument("--min-requests", type=int, default=2, help="leave out waves of fewer requests")
    args = ap.parse_args()
    traces = load(*args.trace)
    for wave in waves(traces, args.wave_gap_ms):
        if len(wave) >= args.min_requests:
            print("\n".join(summarize_wave(traces, wave)))


if __name__ == "__main__":
    main()
