"""The step that runs a vision tower on every request of a batch at once (vision/packed.py's packing).

A subclass loads its tower and says, per request, what it hands the tower (`job`: checked, packed
per-token arrays and attention segments; InvalidInput fails that request alone) and what the tower's
output rows of that request become (`result`). This base packs the batch's jobs into one step, runs
it (a CUDA graph per token bucket on a GPU), and slices each request's rows back out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.step import Request, Step
from triton_omni.vision.packed import PackedRunner, PackedStep


@dataclass
class TowerParams:
    checkpoint: str = ""
    dtype: str = "float32"
    load_format: str = "auto"         # "dummy": random weights of the config's shapes (benchmarks)
    # GPU: packed steps of up to this many tokens (all requests' patches together) replay as CUDA graphs
    # (padded to the next size); larger ones run eagerly. Captured when the step starts.
    cuda_graph_tokens: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    max_graph_segments: int = 64      # attention segments (images, frames, clips) of a step a graph holds
    enforce_eager: bool = False


@dataclass
class TowerJob:
    tokens: dict[str, np.ndarray]     # per-token inputs [n, ...]
    seg_lens: list[int]
    rows: int                         # output rows this request's tokens make


def to_output(t: torch.Tensor):
    """CPU tensors leave as numpy; GPU tensors stay on the GPU (the adapter hands them over by DLPack)."""
    t = t.detach().contiguous()
    return t.numpy() if t.device.type == "cpu" else t


class PackedTowerStep(Step):
    """Subclasses set `self.runner = self.make_runner(tower, inputs)` and implement job / result."""

    @property
    def dummy(self) -> bool:
        if self.params.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {self.params.load_format!r}")
        return self.params.load_format == "dummy"

    def make_runner(self, forward, inputs: dict) -> PackedRunner:
        p = self.params
        device = torch.device(self.ctx.device)
        graphs = (device.type == "cuda" and not p.enforce_eager and torch_dtype(p.dtype) != torch.float32)
        return PackedRunner(forward, inputs, device, p.cuda_graph_tokens, p.max_graph_segments, graphs, self.ctx.log)

    def job(self, req: Request) -> TowerJob:
        raise NotImplementedError

    def result(self, rows: torch.Tensor, job: TowerJob) -> dict:
        raise NotImplementedError

    def execute(self, requests: list[Request]) -> list:
        return self.execute_jobs(requests, self.run)

    def run(self, requests: list[Request], jobs: list[TowerJob]):
        names = jobs[0].tokens.keys()
        step = PackedStep({k: np.concatenate([j.tokens[k] for j in jobs]) for k in names},
                          [n for j in jobs for n in j.seg_lens])
        with torch.inference_mode():
            out = self.runner.run(step) if step.num_tokens else None
        start = 0
        for job in jobs:
            rows = out[start:start + job.rows] if out is not None else None
            start += job.rows
            yield self.result(rows, job)
