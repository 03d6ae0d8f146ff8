"""The Qwen3-TTS codec step's decoder calls alone, at the release decoder's size (random float32 weights,
as bench_tts.py writes them): milliseconds per call of the served stateful decode (StatePool in
python_backends/tts/qwen3_tts/codec_stream.py) for the chunk shapes the server makes: rows (streams in
one call, padded to powers of two as on a GPU) x frames (the first chunk's 3, later chunks' 12), eager
(a Python walk over ~1,300 kernels) and replayed as one CUDA graph per shape.

    python -m perf_analyzer_configs.benchmarks.bench_qwen3_tts_codec --busy --rows 1 16     # on the GPU

Prints one JSON line per shape and mode; --out (results/tts_codec_calls.json and its page) gets them all
with the command, GPU and versions.
--busy also times them while another process keeps the GPU busy as the talker does when served (a CUDA
graph of small matmuls replayed back to back, each replay followed by a small host copy): Triton runs
each step in its own process, and the GPU time-slices between processes.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks.common import device_name, versions
from perf_analyzer_configs.benchmarks.tts_checkpoints import write_qwen3_tts
from triton_omni.tts.qwen3_tts.codec import load_codec
from triton_omni.tts.qwen3_tts.codec_stream import StatePool, StreamingDecoder

BUSY = """
import sys, torch
x = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
ws = [torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) / 32 for _ in range(8)]
def step():
    y = x
    for _ in range(40):
        for w in ws:
            y = torch.tanh(y @ w)
    return y[:, :4]
step(); torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out = step()
print("ready", flush=True)
while True:
    g.replay()
    out.cpu()
"""


def time_calls(pool: StatePool, rows: int, frames: int, calls: int) -> float:
    """Mean ms per call over `calls` calls of rows x frames (after two warm-up calls), each on fresh
    streams' rows that advance call by call as a stream's would."""
    n = pool.decoder.decoder.num_quantizers
    ids = list(range(rows))
    for r in ids:
        pool.reset(r)
    codes = torch.randint(0, 2048, (rows, frames, n), device=pool.device)
    for _ in range(2):
        pool.decode(ids, codes)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        pool.decode(ids, codes)                     # ends with the waveform's copy to the host
    return (time.perf_counter() - t0) / calls * 1e3


def intro(data) -> list[str]:
    syncs = data["tiny_sync_ms_by_busy_neighbour"]
    return [f"The release decoder's size, random float32 weights. Capturing every shape's graph took "
            f"{data['capture_s']} s. One small kernel and a sync: {syncs.get('False')} ms alone"
            + (f", {syncs['True']} ms beside the busy neighbour." if "True" in syncs else ".")]


PAGE = results.Page(
    title="Qwen3-TTS codec decoder calls", module="perf_analyzer_configs.benchmarks.bench_qwen3_tts_codec",
    intro=intro,
    columns=[results.column("rows", "rows"), results.column("frames", "frames"),
             results.column("audio s per call", "audio_s_per_call", ".2f"),
             results.Column("busy neighbour", lambda r: "yes" if r["busy_neighbour"] else "no", numeric=False),
             results.column("eager ms", "eager_ms", ".2f"), results.column("graphs ms", "graphs_ms", ".2f"),
             results.Column("speedup", lambda r: f"{r['speedup']:.2f}x")])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--frames", type=int, nargs="+", default=[3, 12])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--workdir", default="/tmp/triton-omni-bench-tts")
    ap.add_argument("--busy", action="store_true", help="also time the calls beside a GPU-busy process")
    ap.add_argument("--out", type=Path, default=results.RESULTS / "tts_codec_calls.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    folder = write_qwen3_tts(Path(args.workdir) / "checkpoints", "real", "cuda", torch.bfloat16)
    codec = load_codec(folder, "cuda", torch.float32)
    decoder = StreamingDecoder(codec.decoder)
    sizes = tuple(sorted({1 << (r - 1).bit_length() for r in args.rows}))
    eager = StatePool(decoder, max(sizes))
    t0 = time.perf_counter()
    graphs = StatePool(decoder, max(sizes), graph_rows=sizes, graph_frames=max(args.frames))
    graphs.capture()
    capture_s = time.perf_counter() - t0
    print(json.dumps({"capture_s": round(capture_s, 2), "graphs": len(graphs.graphs)}), flush=True)
    rows, syncs = [], {}
    for busy in (False, True) if args.busy else (False,):
        neighbour = None
        if busy:
            neighbour = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
            assert neighbour.stdout.readline().strip() == "ready"
        try:
            t0 = time.perf_counter()
            x = torch.randn(16, 1024, device="cuda")
            for _ in range(200):                    # one small kernel and a sync: the scheduling latency
                (x @ x.T)[0, 0].item()
            syncs[str(busy)] = round((time.perf_counter() - t0) / 200 * 1e3, 3)
            print(json.dumps({"busy_neighbour": busy, "tiny_sync_ms": syncs[str(busy)]}), flush=True)
            for r in args.rows:
                for t in args.frames:
                    row = {"rows": r, "frames": t, "audio_s_per_call": r * t * 0.08, "busy_neighbour": busy}
                    for mode, pool in (("eager", eager), ("graphs", graphs)):
                        row[f"{mode}_ms"] = round(time_calls(pool, r, t, args.calls), 2)
                    row["speedup"] = round(row["eager_ms"] / row["graphs_ms"], 2)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            if neighbour:
                neighbour.kill()
                neighbour.wait()
    results.write(args.out, PAGE, rows, {"gpu": device_name(), "versions": versions(), "capture_s": round(capture_s, 2),
                                         "tiny_sync_ms_by_busy_neighbour": syncs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
