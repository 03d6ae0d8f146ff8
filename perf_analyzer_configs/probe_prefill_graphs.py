"""Does replaying a whole-burst prefill graph slow the decode steps after it? (H200 question of
results/ar_decode.md's notes.) One in-process engine of the qwen3-0.6b shape (dummy weights) with prefill
graphs up to 32768 tokens; waves of 64 prompts of 512 tokens, each prefilled as one graph replay
("graph") or eagerly (the buckets above 2048 hidden: "eager"), then timed:
  step_ms    100 engine steps (launch + collect), wall clock
  replay_ms  100 back-to-back replays of the 64-row decode graph, CUDA events (GPU time only)
"graph+sleep" sleeps 1 s after the prefill, "graph+small" replays a 16-token prefill graph after it.
Then two waves of the same prompts, eager and graph, compared: KV of every layer at the prompts' slots,
first tokens, and tokens 30 steps later.

    python perf_analyzer_configs/probe_prefill_graphs.py       # on the GPU machine, ~1 minute
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf_analyzer_configs.bench_ar_decode import prompts, write_checkpoint  # noqa: E402
from triton_omni.ar.model_runner import GREEDY  # noqa: E402
from triton_omni.ar.sampling import SamplingParams  # noqa: E402
from triton_omni.ar.step import ARParams, build_engine  # noqa: E402

BIG = [16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768]
folder = write_checkpoint("qwen3-0.6b", Path("/tmp/probe_prefill_graphs"))
params = ARParams(dtype="bfloat16", max_num_seqs=64, max_model_len=784, max_num_batched_tokens=32768,
                  load_format="dummy", cuda_graph_prefill_tokens=BIG)
engine, _ = build_engine(folder, params, "cuda:0")
runner = engine.runner
all_sizes = list(runner.prefill_sizes)
sp = SamplingParams(max_tokens=250, temperature=0.0, ignore_eos=True)


def timed_steps(n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        engine.step()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / n


def timed_replays(n: int) -> float:
    graph = runner._graph(64, GREEDY)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def prefill(mode: str, seed: int) -> list:
    """Add 64 prompts and run their prefill, as a graph replay or eagerly."""
    runner.prefill_sizes = all_sizes if mode.startswith("graph") else [t for t in all_sizes if t <= 2048]
    seqs = [engine.add(p, sp) for p in prompts(64, 512, engine.vocab_size, seed)]
    engine.step()
    runner.prefill_sizes = all_sizes
    return seqs


def finish(seqs) -> None:
    for s in seqs:
        engine.abort(s)
    engine.run_until_done()


def wave(mode: str, seed: int) -> dict:
    seqs = prefill(mode, seed)
    if mode == "graph+sleep":
        torch.cuda.synchronize()
        time.sleep(1.0)
    if mode == "graph+small":
        torch.cuda.synchronize()
        runner._load_prefill_inputs([], 16)
        runner.prefill_graphs[16].replay()
    warm = timed_steps(20)
    steps = timed_steps(100)
    replay = timed_replays(100)
    finish(seqs)
    return {"mode": mode, "warm_ms": round(warm, 4), "step_ms": round(steps, 4), "replay_ms": round(replay, 4)}


def snapshot(seqs, decode_steps: int = 0) -> dict:
    for _ in range(decode_steps):
        engine.step()
    torch.cuda.synchronize()
    rows = torch.tensor([s.row for s in seqs], device="cuda")
    slots = torch.cat([torch.tensor([b * 16 + i for b in s.block_table for i in range(16)][:512]) for s in seqs]).cuda()
    kv = [(m.k_cache.flatten(0, 1)[slots], m.v_cache.flatten(0, 1)[slots]) for m, _ in runner.layers]
    return {"tokens": runner.last_token[rows].clone(), "kv": kv}


out = []
for rep in range(3):
    for mode in ("eager", "graph", "graph+sleep", "graph+small", "eager"):
        out.append(wave(mode, 100 * rep + len(out)))
        print(json.dumps(out[-1]), flush=True)
for mode in ("eager", "graph", "graph+sleep", "graph+small"):
    rows = [o for o in out if o["mode"] == mode]
    print(mode, "step", statistics.median(o["step_ms"] for o in rows), "replay", statistics.median(o["replay_ms"] for o in rows))

seqs = prefill("eager", 7)
a = snapshot(seqs)
finish(seqs)
seqs = prefill("graph", 7)
b = snapshot(seqs)
finish(seqs)
same_kv = all(torch.equal(x, y) for la, lb in zip(a["kv"], b["kv"]) for x, y in zip(la, lb))
print("same KV at every prompt slot:", same_kv, "same first tokens:", torch.equal(a["tokens"], b["tokens"]))
seqs = prefill("eager", 9)
a = snapshot(seqs, 30)
finish(seqs)
seqs = prefill("graph", 9)
b = snapshot(seqs, 30)
finish(seqs)
print("same tokens 30 steps later:", torch.equal(a["tokens"], b["tokens"]))
