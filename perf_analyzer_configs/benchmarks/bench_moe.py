"""One mixture-of-experts layer alone: our router matmul + kernels/moe.sparse_moe (its decode kernels up
to GEMV_MAX_TOKENS tokens, the grouped path past it; both forced at the sizes between, to place that
threshold) against transformers' own sparse MoE block (router, softmax/top-k, experts through its
`grouped_mm` and `batched_mm` implementations) on the same weights, bfloat16, for 1 to 4,096 tokens,
on the Qwen3-30B-A3B and Qwen3.5-35B-A3B layer shapes.

    python -m perf_analyzer_configs.benchmarks.bench_moe            # on the GPU
    python -m perf_analyzer_configs.benchmarks.bench_moe --smoke    # tiny shape on the CPU (checks the script)

Two copies of the layer's weights alternate (past the L2, as 40-48 layers are in a real step). Ours is
replayed from a CUDA graph (as a captured decode step runs it), transformers' eagerly unless it captures.
`weights GB/s`: bytes of the experts the tokens reach (and the router, the shared expert) over the time,
to hold against the copy bandwidth (bench_ar_decode's roofline). --out writes results/moe_layer.json and
its page.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks.common import device_name, versions

# name -> (experts E, top k, hidden H, expert intermediate I, shared expert intermediate)
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768, 0), "qwen3.5-35b-a3b": (256, 8, 2048, 512, 512),
          "tiny": (8, 2, 64, 32, 32)}
TOKENS = [1, 2, 4, 8, 16, 64, 512, 4096]


def time_us(fn, graph: bool, reps: int = 10) -> float:
    """Microseconds a call, from a CUDA graph of `reps` calls (graph) or timed eagerly."""
    if not torch.cuda.is_available():
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        run = g.replay
    else:
        def run():
            for _ in range(reps):
                fn()
    run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (3 * reps)


def hf_block(shape, impl: str, device, dtype):
    """transformers' Qwen3-MoE block (its experts through `impl`), or Qwen3.5-MoE's with its shared expert."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3MoeConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    E, k, H, I, shared = shape
    common = dict(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k)
    if shared:
        config, cls = Qwen3_5MoeTextConfig(shared_expert_intermediate_size=shared, **common), Qwen3_5MoeSparseMoeBlock
    else:
        config, cls = Qwen3MoeConfig(norm_topk_prob=True, **common), Qwen3MoeSparseMoeBlock
    config._experts_implementation = impl
    with torch.device(device):
        block = cls(config).to(dtype).eval()
    for p in block.parameters():
        p.data.normal_(0.0, 0.02)
    return block


def ours(block, h):
    """Our path from the same weights: the router (+ shared expert gate and gate/up) matmul, then the kernels."""
    from triton_omni.kernels import moe

    E, k = block.gate.weight.shape[0], block.gate.top_k
    shared = getattr(block, "shared_expert", None)
    if shared is None:
        router = block.gate.weight
    else:
        router = torch.cat([block.gate.weight, block.shared_expert_gate.weight, shared.gate_proj.weight,
                            shared.up_proj.weight])
    gate_up, down = block.experts.gate_up_proj.data, block.experts.down_proj.data

    def run():
        projected = F.linear(h, router)
        extra = None if shared is None else (projected[:, E:E + 1], projected[:, E + 1:], shared.down_proj.weight)
        return moe.sparse_moe(h, projected[:, :E], gate_up, down, k, True, None, extra)
    return run


def weight_bytes(block, h) -> int:
    """What one call must read: the router, the experts some token goes to, the shared expert."""
    ids = torch.topk(F.linear(h, block.gate.weight), block.gate.top_k).indices
    per_expert = (block.experts.gate_up_proj[0].numel() + block.experts.down_proj[0].numel())
    shared = sum(p.numel() for n, p in block.named_parameters() if n.startswith("shared_expert"))
    return 2 * (block.gate.weight.numel() + int(ids.unique().numel()) * per_expert + shared)


def bench_shape(name, shape, tokens, device, dtype) -> list[dict]:
    from triton_omni.kernels import moe

    blocks = {impl: [hf_block(shape, impl, device, dtype) for _ in range(2)] for impl in ("grouped_mm", "batched_mm")}
    for impl in ("batched_mm",):             # the same weights for every implementation
        for a, b in zip(blocks[impl], blocks["grouped_mm"]):
            a.load_state_dict(b.state_dict())
    rows = []
    for T in tokens:
        h = torch.randn(T, shape[2], device=device, dtype=dtype)
        first = blocks["grouped_mm"][0]
        ref, got = first(h[None])[0].float(), ours(first, h)().float()
        row = {"model": name, "tokens": T, "max_abs_diff": (got - ref).abs().max().item(),
               "weights_MB": weight_bytes(first, h) / 1e6}
        variants = {"ours": (None, True)}
        if T <= 4 * moe.GEMV_MAX_TOKENS:            # both of our paths around the threshold
            variants.update({"ours decode kernels": (10 ** 9, True), "ours grouped": (0, True)})
        for label, (limit, graph) in variants.items():
            saved = moe.GEMV_MAX_TOKENS
            moe.GEMV_MAX_TOKENS = saved if limit is None else limit
            try:
                calls = [ours(b, h) for b in blocks["grouped_mm"]]
                row[f"{label} us"] = time_us(lambda: [c() for c in calls], graph) / 2
            finally:
                moe.GEMV_MAX_TOKENS = saved
        for impl, pair in blocks.items():
            row[f"transformers {impl} us"] = time_us(lambda: [b(h[None]) for b in pair], graph=False) / 2
        row["weights GB/s"] = row["weights_MB"] / row["ours us"] / 1e3
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _us(key):
    return results.Column(key, lambda r: f"{r[key]:.1f}" if key in r else "")


PAGE = results.Page(
    title="One MoE layer", module="perf_analyzer_configs.benchmarks.bench_moe",
    intro=lambda data: [f"{data['dtype']}, random weights (two copies alternating), tokens routed by the router's "
                        "softmax/top-k; ours from a CUDA graph, transformers eagerly. Times are per layer call."],
    columns=[results.column("model", "model", numeric=False), results.column("tokens", "tokens"),
             _us("ours us"), _us("ours decode kernels us"), _us("ours grouped us"),
             _us("transformers grouped_mm us"), _us("transformers batched_mm us"),
             results.column("weights MB", "weights_MB", ".0f"), results.column("weights GB/s", "weights GB/s", ".0f")])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen3-30b-a3b", "qwen3.5-35b-a3b"], choices=sorted(SHAPES))
    ap.add_argument("--tokens", nargs="+", type=int, default=TOKENS)
    ap.add_argument("--out", type=Path, default=results.RESULTS / "moe_layer.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU (Triton's interpreter), to check the script")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if args.smoke:
        args.models, args.tokens = ["tiny"], [1, 8]
    elif not cuda:
        print("needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    torch.set_grad_enabled(False)
    rows = []
    for name in args.models:
        rows += bench_shape(name, SHAPES[name], args.tokens, device, dtype)
    results.write(args.out, PAGE, rows, {"gpu": device_name(), "versions": versions("transformers", "triton"),
                                         "dtype": str(dtype).removeprefix("torch.")})
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
