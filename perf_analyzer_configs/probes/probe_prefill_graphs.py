"""Does replaying a whole-burst prefill graph slow the decode steps after it? (H200 question of
results/ar_decode.md's notes.) One in-process engine of the qwen3-0.6b shape (dummy weights) with prefill
graphs up to 32768 tokens; waves of 64 prompts of 512 tokens, each prefilled as one graph replay
("graph") or eagerly (the buckets above 2048 hidden: "eager"), then timed:
  step_ms    100 engine steps (launch + collect), wall clock
  replay_ms  100 back-to-back replays of the 64-row decode graph, CUDA events (GPU time only)
"graph+sleep" sleeps 1 s after the prefill, "graph+small" replays a 16-token prefill graph after it.
Then two waves of the same prompts, eager and graph, compared: KV of every layer at the prompts' slots,
first tokens, and tokens 30 steps later.

    python -m perf_analyzer_configs.probes.probe_prefill_graphs     # on the GPU machine, ~1 minute
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from perf_analyzer_configs.benchmarks.ar_checkpoints import prompts, write_checkpoint

BIG = [16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768]


class Probe:
    """One engine with prefill graphs up to 32768 tokens, and waves of 64 prompts through it."""

    def __init__(self, workdir: Path):
        from triton_omni.ar.sampling import SamplingParams
        from triton_omni.ar.step import ARParams, build_engine

        folder = write_checkpoint("qwen3-0.6b", workdir)
        params = ARParams(dtype="bfloat16", max_num_seqs=64, max_model_len=784, max_num_batched_tokens=32768,
                          load_format="dummy", cuda_graph_prefill_tokens=BIG)
        self.engine, _ = build_engine(folder, params, "cuda:0")
        self.runner = self.engine.runner
        self.all_sizes = list(self.runner.prefill_sizes)
        self.sp = SamplingParams(max_tokens=250, temperature=0.0, ignore_eos=True)

    def timed_steps(self, n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            self.engine.step()
        torch.cuda.synchronize()
        return 1e3 * (time.perf_counter() - t0) / n

    def timed_replays(self, n: int) -> float:
        from triton_omni.ar.model_runner import GREEDY

        graph = self.runner._graph(64, GREEDY)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / n

    def prefill(self, mode: str, seed: int) -> list:
        """Add 64 prompts and run their prefill, as a graph replay or eagerly."""
        runner = self.runner
        runner.prefill_sizes = self.all_sizes if mode.startswith("graph") else [t for t in self.all_sizes if t <= 2048]
        seqs = [self.engine.add(p, self.sp) for p in prompts(64, 512, self.engine.vocab_size, seed)]
        self.engine.step()
        runner.prefill_sizes = self.all_sizes
        return seqs

    def finish(self, seqs) -> None:
        for s in seqs:
            self.engine.abort(s)
        self.engine.run_until_done()

    def wave(self, mode: str, seed: int) -> dict:
        seqs = self.prefill(mode, seed)
        if mode == "graph+sleep":
            torch.cuda.synchronize()
            time.sleep(1.0)
        if mode == "graph+small":
            torch.cuda.synchronize()
            self.runner._load_prefill_inputs([], 16)
            self.runner.prefill_graphs[16].replay()
        warm = self.timed_steps(20)
        steps = self.timed_steps(100)
        replay = self.timed_replays(100)
        self.finish(seqs)
        return {"mode": mode, "warm_ms": round(warm, 4), "step_ms": round(steps, 4), "replay_ms": round(replay, 4)}

    def snapshot(self, seqs, decode_steps: int = 0) -> dict:
        for _ in range(decode_steps):
            self.engine.step()
        torch.cuda.synchronize()
        rows = torch.tensor([s.row for s in seqs], device="cuda")
        slots = torch.cat([torch.tensor([b * 16 + i for b in s.block_table for i in range(16)][:512])
                           for s in seqs]).cuda()
        kv = [(m.k_cache.flatten(0, 1)[slots], m.v_cache.flatten(0, 1)[slots]) for m, _ in self.runner.layers]
        return {"tokens": self.runner.last_token[rows].clone(), "kv": kv}

    def compare(self, seed: int, decode_steps: int) -> tuple[dict, dict]:
        """The same prompts prefilled eagerly, then as a graph: snapshots after `decode_steps` steps."""
        out = []
        for mode in ("eager", "graph"):
            seqs = self.prefill(mode, seed)
            out.append(self.snapshot(seqs, decode_steps))
            self.finish(seqs)
        return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/probe_prefill_graphs"))
    args = ap.parse_args()
    probe = Probe(args.workdir)
    out = []
    for rep in range(3):
        for mode in ("eager", "graph", "graph+sleep", "graph+small", "eager"):
            out.append(probe.wave(mode, 100 * rep + len(out)))
            print(json.dumps(out[-1]), flush=True)
    for mode in ("eager", "graph", "graph+sleep", "graph+small"):
        rows = [o for o in out if o["mode"] == mode]
        print(mode, "step", statistics.median(o["step_ms"] for o in rows),
              "replay", statistics.median(o["replay_ms"] for o in rows))
    a, b = probe.compare(7, 0)
    same_kv = all(torch.equal(x, y) for la, lb in zip(a["kv"], b["kv"]) for x, y in zip(la, lb))
    print("same KV at every prompt slot:", same_kv, "same first tokens:", torch.equal(a["tokens"], b["tokens"]))
    a, b = probe.compare(9, 30)
    print("same tokens 30 steps later:", torch.equal(a["tokens"], b["tokens"]))


if __name__ == "__main__":
    main()
