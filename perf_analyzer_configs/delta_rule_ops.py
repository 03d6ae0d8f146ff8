"""Kernels of one Gated DeltaNet layer's prefill (Qwen3.5's linear attention), counted on the CPU.

Qwen3.5 prefills eagerly (no prefill graphs for linear-attention layers yet), so on a GPU its time to
first token is bounded by launches: every aten op that is not a view is a kernel there.

    python perf_analyzer_configs/delta_rule_ops.py                      # one 512-token prompt
    python perf_analyzer_configs/delta_rule_ops.py --lens 512 300 100 77 --shape qwen3.5-9b

The layer has the shape's widths and random weights; the input is its fused projection's output. What
a forward derives once for all its layers (ForwardContext.memo: the chunk layout, host work) is left out.
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class CountKernels(TorchDispatchMode):
    """aten ops that produce new data (views and metadata-only ops are not kernels)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        aliases = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        if not aliases and func.overloadpacket.__name__ not in ("detach", "lift_fresh"):
            self.ops[func.overloadpacket.__name__] += 1
        return out


def main() -> int:
    from transformers import Qwen3_5TextConfig

    from perf_analyzer_configs.bench_ar_decode import SHAPES
    from python_backends.models.context import ForwardContext
    from python_backends.models.qwen3_5 import Qwen3_5GatedDeltaNet

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3.5-0.8b", choices=[k for k, v in SHAPES.items() if "linear_num_key_heads" in v])
    ap.add_argument("--lens", nargs="+", type=int, default=[512], help="packed prompt lengths")
    args = ap.parse_args()
    shape = {k: v for k, v in SHAPES[args.shape].items() if k != "model_type"}
    config = Qwen3_5TextConfig(**shape)
    torch.manual_seed(0)
    layer = Qwen3_5GatedDeltaNet(config).eval()
    spec, S, T = layer.cache_spec(), len(args.lens), sum(args.lens)
    layer.conv_state = torch.zeros(S, *spec.conv_shape)
    layer.ssm_state = torch.zeros(S, *spec.state_shape)
    x = 0.3 * torch.randn(T, sum(layer.in_proj.out_sizes))
    positions = torch.cat([torch.arange(n) for n in args.lens])
    cu = torch.tensor([0, *args.lens]).cumsum(0).int()

    ctx = ForwardContext(is_prefill=True, slot_mapping=torch.zeros(T, dtype=torch.long), state_slots=torch.arange(S),
                         seq_lens=list(args.lens), cu_seqlens=cu, max_seqlen=max(args.lens))
    with torch.inference_mode():
        layer(x, positions, ctx)      # warm-up, as a forward's first layer: what it derives once per forward stays in ctx
        count = CountKernels()
        with count:
            layer(x, positions, ctx)
        t = time.perf_counter()
        layer(x, positions, ctx)
        cpu_ms = 1e3 * (time.perf_counter() - t)
    print(f"{args.shape}, prompts {args.lens}: {sum(count.ops.values())} kernels in one DeltaNet layer's prefill "
          f"({config.layer_types.count('linear_attention')} such layers); {cpu_ms:.0f} ms on this CPU")
    print("most frequent:", ", ".join(f"{k} {n}" for k, n in count.ops.most_common(8)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
