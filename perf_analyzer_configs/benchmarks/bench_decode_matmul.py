"""A batch-1 decode step's matmuls alone: cuBLAS (F.linear, plus the silu_and_mul kernel for down_proj,
plus the RMSNorm kernel before q/k/v and gate/up) against the skinny Triton kernels that replace them
on the GPU (kernels/decode_matmul.skinny_linear, skinny_norm_linear), on the Qwen3-0.6B and Qwen3-8B
shapes, bfloat16, one input row.

    python -m perf_analyzer_configs.benchmarks.bench_decode_matmul     # on the GPU
    python -m perf_analyzer_configs.benchmarks.bench_decode_matmul --weights fp8 --sweep   # FP8 weights (models/quant.py)

--weights fp8: the skinny FP8 kernels (kernels/fp8_matmul.py; per-channel scales, and per 128x128
block for q/k/v) against the bf16 skinny kernels on the same shapes; --sweep also times the tile
shapes around each FP8 default and reports the fastest (kernels.fp8_matmul.CONFIG_OVERRIDE takes one).

Each shape's weights are rotated past the L2 (>= 200 MB of copies, as 28-36 layers are in a real step)
and every variant is replayed from a CUDA graph, so the times are what a captured decode step sees.
Prints a table; --out (results/decode_matmul.json and its page) gets it with the command, GPU and versions.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks.common import device_name, versions

# name -> (out features N, in features K, what runs before it in the layer)
SHAPES = {
    "qwen3-0.6b": {"qkv_proj": (4096, 1024, "norm"), "o_proj": (1024, 2048, None),
                   "gate_up_proj": (6144, 1024, "norm"), "down_proj": (1024, 3072, "silu")},
    "qwen3-8b": {"qkv_proj": (6144, 4096, "norm"), "o_proj": (4096, 4096, None),
                 "gate_up_proj": (24576, 4096, "norm"), "down_proj": (4096, 12288, "silu")},
}


def graph_time_us(fn, calls: int, reps: int = 20) -> float:
    """Microseconds per call of fn (which makes `calls` calls), replayed from a CUDA graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * reps * calls)


def bench_shape(N: int, K: int, before: str | None) -> dict:
    from triton_omni.kernels import decode_matmul as ops, norms

    copies = max(1, int(200e6 // (N * K * 2)))
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(copies)]
    x = torch.randn(1, 2 * K if before == "silu" else K, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    nw = torch.rand(K, device="cuda", dtype=torch.bfloat16) + 0.5
    if before == "norm":
        def ours(w):
            return ops.skinny_norm_linear(x, res, nw, 1e-6, False, w)[0]

        def cublas(w):
            return F.linear(norms.rms_norm(x, nw, 1e-6, res)[0], w)
    elif before == "silu":
        def ours(w):
            return ops.skinny_linear(x, w, None, gated=True)

        def cublas(w):
            return F.linear(norms.silu_and_mul(x), w)
    else:
        def ours(w):
            return ops.skinny_linear(x, w)

        def cublas(w):
            return F.linear(x, w)
    max_diff = (ours(ws[0]).float() - cublas(ws[0]).float()).abs().max().item()
    t_cublas = graph_time_us(lambda: [cublas(w) for w in ws], copies)
    t_ours = graph_time_us(lambda: [ours(w) for w in ws], copies)
    return {"N": N, "K": K, "before": before or "", "cublas_us": t_cublas, "skinny_us": t_ours,
            "speedup": t_cublas / t_ours, "skinny_GBps": N * K * 2 / t_ours / 1e3, "max_abs_diff": max_diff}


def bench_shape_fp8(N: int, K: int, before: str | None, block, sweep: bool) -> dict:
    from triton_omni.kernels import decode_matmul as bf16_ops, fp8_matmul as ops
    from triton_omni.kernels.fp8_matmul_reference import quantize_weight

    copies = max(1, int(200e6 // (N * K)))
    ws = [quantize_weight(torch.randn(N, K, device="cuda") / K ** 0.5, block) for _ in range(copies)]
    bf16 = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(max(1, copies // 2))]
    x = torch.randn(1, 2 * K if before == "silu" else K, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    nw = torch.rand(K, device="cuda", dtype=torch.bfloat16) + 0.5
    if before == "norm":
        def ours(q, s):
            return ops.skinny_fp8_norm_linear(x, res, nw, 1e-6, False, q, s)[0]

        def base(w):
            return bf16_ops.skinny_norm_linear(x, res, nw, 1e-6, False, w)[0]
    else:
        def ours(q, s):
            return ops.skinny_fp8_linear(x, q, s, None, gated=before == "silu")

        def base(w):
            return bf16_ops.skinny_linear(x, w, None, gated=before == "silu")
    t_bf16 = graph_time_us(lambda: [base(w) for w in bf16], len(bf16))
    t_fp8 = graph_time_us(lambda: [ours(q, s) for q, s in ws], copies)
    row = {"N": N, "K": K, "before": before or "", "scales": "per block" if block else "per channel",
           "bf16_skinny_us": t_bf16, "fp8_skinny_us": t_fp8, "speedup": t_bf16 / t_fp8,
           "fp8_GBps": N * K / t_fp8 / 1e3, "config": list(ops._fp8_config(N, K, before == "silu", block[0] if block else 0))}
    if sweep:
        key, tried = (N, K, before == "silu"), {}
        bn0, bk0, w0 = row["config"]
        for bn in {max(1, bn0 // 2), bn0, 2 * bn0}:
            for bk in {max(16, bk0 // 2), bk0, min(2 * bk0, 8192)}:
                for warps in (4, 8):
                    if block and block[0] % bn:
                        continue
                    ops.CONFIG_OVERRIDE[key] = (bn, bk, warps)
                    try:
                        tried[f"{bn}x{bk}/{warps}w"] = graph_time_us(lambda: [ours(q, s) for q, s in ws], copies)
                    except Exception as exc:  # noqa: BLE001 - a tile that does not compile or fit: skipped
                        print(f"  {N}x{K} {bn}x{bk}/{warps}w: {type(exc).__name__}", flush=True)
        ops.CONFIG_OVERRIDE.pop(key, None)
        best = min(tried, key=tried.get)
        row.update(sweep_best=best, sweep_best_us=tried[best], sweep=tried)
    return row


FP8_PAGE_COLUMNS = [
    results.column("model", "model", numeric=False), results.column("matmul", "matmul", numeric=False),
    results.Column("N x K", lambda r: f"{r['N']} x {r['K']}", numeric=False),
    results.column("before", "before", numeric=False), results.column("scales", "scales", numeric=False),
    results.column("bf16 skinny us", "bf16_skinny_us", ".2f"), results.column("fp8 skinny us", "fp8_skinny_us", ".2f"),
    results.Column("speedup", lambda r: f"{r['speedup']:.2f}x"), results.column("fp8 GB/s", "fp8_GBps", ".0f"),
    results.Column("tiles (N, K, warps)", lambda r: str(tuple(r["config"])), numeric=False),
    results.Column("sweep best", lambda r: f"{r['sweep_best']} {r['sweep_best_us']:.2f} us" if "sweep_best" in r else "",
                   numeric=False)]
FP8_PAGE = results.Page(
    title="Batch-1 decode matmuls, FP8 weights", module="perf_analyzer_configs.benchmarks.bench_decode_matmul",
    intro=lambda data: [
        "One bf16 input row against FP8 E4M3 weights (weights rotated past the L2, CUDA graphs), the skinny FP8 "
        "kernel against the bf16 skinny kernel on bf16 weights of the same shape, norm / silu prologues as in a "
        "decode step."],
    columns=FP8_PAGE_COLUMNS)
PAGES = {"decode_matmul_fp8": FP8_PAGE}             # results.py: the page of each file this benchmark writes


PAGE = results.Page(
    title="Batch-1 decode matmuls", module="perf_analyzer_configs.benchmarks.bench_decode_matmul",
    intro=lambda data: [
        "bfloat16, one input row, weights rotated past the L2, each variant replayed from a CUDA graph. cuBLAS "
        "includes the kernel before the matmul that the skinny kernel folds in (before: norm = residual add + "
        "RMSNorm, silu = silu(gate) * up)."],
    columns=[results.column("model", "model", numeric=False), results.column("matmul", "matmul", numeric=False),
             results.Column("N x K", lambda r: f"{r['N']} x {r['K']}", numeric=False),
             results.column("before", "before", numeric=False), results.column("cuBLAS us", "cublas_us", ".2f"),
             results.column("skinny us", "skinny_us", ".2f"),
             results.Column("speedup", lambda r: f"{r['speedup']:.2f}x"),
             results.column("skinny GB/s", "skinny_GBps", ".0f")],
    plot=results.Plot(panels=[("", "us per call")], bars=[("cublas_us", "cuBLAS"), ("skinny_us", "ours (skinny)")],
                      category=lambda r: f"{r['matmul']} {r['N']}x{r['K']}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="default: results/decode_matmul.json (fp8: decode_matmul_fp8.json)")
    ap.add_argument("--weights", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--sweep", action="store_true", help="fp8: also time the tile shapes around each default")
    args = ap.parse_args()
    args.out = args.out or results.RESULTS / ("decode_matmul.json" if args.weights == "bf16" else "decode_matmul_fp8.json")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for model, shapes in SHAPES.items():
        for name, (N, K, before) in shapes.items():
            if args.weights == "bf16":
                rows.append({"model": model, "matmul": name, **bench_shape(N, K, before)})
            else:
                for block in (None, (128, 128)) if name == "qkv_proj" else (None,):
                    rows.append({"model": model, "matmul": name, **bench_shape_fp8(N, K, before, block, args.sweep)})
            print(json.dumps(rows[-1]), flush=True)
    page = PAGE if args.weights == "bf16" else FP8_PAGE
    results.write(args.out, page, rows, {"gpu": device_name(), "versions": versions("triton")})
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
