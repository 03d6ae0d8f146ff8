"""Every request's images, frames and clips of one step in one variable-length call.

A vision tower's attention is bidirectional within an item (an image, a video frame, a clip) and
never across items, so a step's items are packed end to end into one row of tokens with cu_seqlens
marking where each attention segment starts: one launch per layer op for the whole step, whatever
the mix of sizes (no padding to the largest, no per-size groups). `varlen_attention` is that
attention: the varlen flash kernel on a GPU, one SDPA call per segment elsewhere (the reference).

`PackedRunner` runs a tower's forward on such a row. On a GPU it replays the forward as a CUDA graph
of the smallest bucket of `sizes` that holds the step's tokens: the M* "slot lease", one row of
static input buffers leased by each step, with the padding tokens as one more segment at the end
(they attend only to each other, and the rows they produce are dropped). So the tower's block loop,
hundreds of launches a step, is one replay; steps larger than the largest bucket run eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F


def flash_varlen_supported(dtype: torch.dtype, head_dim: int, device) -> bool:
    d = torch.device(device)
    return (d.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0 and head_dim <= 256
            and torch.cuda.get_device_capability(d)[0] >= 8 and hasattr(torch.ops.aten, "_flash_attention_forward"))


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     scale: float, seg_lens: list[int] | None = None) -> torch.Tensor:
    """Bidirectional attention within each packed segment. q, k, v [T, H, D]; cu_seqlens [S + 1] int32 on
    the device (segments may be empty); `seg_lens` the host lengths where known (the reference path)."""
    if flash_varlen_supported(q.dtype, q.shape[-1], q.device):
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                       0.0, False, False, scale=scale)[0]
    if seg_lens is None:
        seg_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    out, start = [], 0
    for n in seg_lens:
        if n:
            qs, ks, vs = (t[start:start + n].transpose(0, 1)[None] for t in (q, k, v))
            out.append(F.scaled_dot_product_attention(qs, ks, vs, scale=scale)[0].transpose(0, 1))
        start += n
    if start < q.shape[0]:            # rows past the last segment (none in a real step)
        out.append(torch.zeros_like(q[start:]))
    return torch.cat(out, dim=0) if out else q.new_zeros(q.shape)


@dataclass
class PackedStep:
    """One step's items packed: per-token host arrays (every one [T, ...]) and the attention segments."""
    tokens: dict[str, np.ndarray]
    seg_lens: list[int]

    @property
    def num_tokens(self) -> int:
        return int(sum(self.seg_lens))


# forward(inputs: name -> device tensor [T, ...], cu_seqlens [S + 1] int32, max_seqlen, seg_lens or None)
Forward = Callable[[dict[str, torch.Tensor], torch.Tensor, int, "list[int] | None"], torch.Tensor]


class PackedRunner:
    """Runs `forward` on packed steps, eagerly or (GPU) as one CUDA graph per token bucket.

    `inputs` names the per-token inputs: name -> (shape after the token dimension, dtype). A bucket's
    static inputs are views of buffers sized for the largest bucket; cu_seqlens holds the step's
    segments, then empty ones up to `max_segments`, then the padding as the last segment."""

    def __init__(self, forward: Forward, inputs: dict[str, tuple[tuple[int, ...], torch.dtype]],
                 device: torch.device, sizes: list[int], max_segments: int, use_graphs: bool, log=print):
        self.forward, self.specs, self.device = forward, inputs, torch.device(device)
        self.sizes, self.max_segments = sorted(set(sizes)), max_segments
        self.use_graphs = use_graphs and self.device.type == "cuda" and bool(self.sizes)
        self.log = log
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.static: dict[str, torch.Tensor] = {}
        self.cu: torch.Tensor | None = None
        self.pool = None
        self.executions = 0                 # forward calls (graph replays or eager runs), for tests and stats

    def upload(self, array: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        host = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type == "cuda":
            return host.pin_memory().to(self.device, dtype or host.dtype, non_blocking=True)
        return host.to(self.device, dtype or host.dtype)

    def bucket(self, step: PackedStep) -> int | None:
        if not self.use_graphs or len(step.seg_lens) > self.max_segments:
            return None
        return next((t for t in self.sizes if t >= step.num_tokens), None)

    def run(self, step: PackedStep) -> torch.Tensor:
        """The forward's output for the packed step; its first rows are the real tokens' (a graph's output
        has the bucket's rows: the caller takes what its tokens make)."""
        self.executions += 1
        t = self.bucket(step)
        if t is None:
            return self.eager(step)
        self._load(step, t)
        graph, out = self._graph(t)
        graph.replay()
        return out

    def eager(self, step: PackedStep) -> torch.Tensor:
        inputs = {name: self.upload(step.tokens[name], dtype) for name, (_, dtype) in self.specs.items()}
        cu = np.zeros(len(step.seg_lens) + 1, np.int32)
        np.cumsum(step.seg_lens, out=cu[1:])
        return self.forward(inputs, self.upload(cu), max(step.seg_lens, default=0), list(step.seg_lens))

    def bucket_layout(self, step: PackedStep, t: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Bucket `t`'s inputs for the step as host arrays: the tokens, then zero padding to t; cu_seqlens
        [max_segments + 2]. (What a graph replays; tests run it eagerly.)"""
        n = step.num_tokens
        padded = {}
        for name, (shape, dtype) in self.specs.items():
            value = np.asarray(step.tokens[name])
            buf = np.zeros((t, *shape), dtype=value.dtype)
            buf[:n] = value
            padded[name] = buf
        cu = np.full(self.max_segments + 2, n, np.int32)
        cu[0] = 0
        np.cumsum(step.seg_lens, out=cu[1:len(step.seg_lens) + 1])
        cu[-1] = t
        return padded, cu

    def run_bucket_eagerly(self, step: PackedStep, t: int) -> torch.Tensor:
        padded, cu = self.bucket_layout(step, t)
        inputs = {name: self.upload(padded[name], dtype) for name, (_, dtype) in self.specs.items()}
        return self.forward(inputs, self.upload(cu), t, None)

    def _load(self, step: PackedStep, t: int) -> None:
        if not self.static:
            largest = self.sizes[-1]
            self.static = {name: torch.zeros((largest, *shape), dtype=dtype, device=self.device)
                           for name, (shape, dtype) in self.specs.items()}
            self.cu = torch.zeros(self.max_segments + 2, dtype=torch.int32, device=self.device)
        padded, cu = self.bucket_layout(step, t)
        for name, (_, dtype) in self.specs.items():
            self.static[name][:t].copy_(self.upload(padded[name], dtype))
        self.cu.copy_(self.upload(cu))

    def _graph(self, t: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        if t not in self.graphs:
            views = {name: buf[:t] for name, buf in self.static.items()}
            torch.cuda.synchronize(self.device)
            self.forward(views, self.cu, t, None)            # warm-up: kernels compiled, allocations made
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.forward(views, self.cu, t, None)
            self.pool = graph.pool()
            self.graphs[t] = (graph, out)
        return self.graphs[t]

    @torch.inference_mode()
    def capture(self, example: Callable[[int], PackedStep]) -> None:
        """Capture every bucket at start (`example(t)`: a step of t tokens to load first)."""
        if not self.use_graphs:
            return
        for t in self.sizes:
            self._load(example(t), t)
            self._graph(t)
