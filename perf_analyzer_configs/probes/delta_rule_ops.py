"""Kernels of one Gated DeltaNet layer's prefill (Qwen3.5's linear attention), counted on the CPU.

Qwen3.5 prefills eagerly (no prefill graphs for linear-attention layers yet), so on a GPU its time to
first token is bounded by launches; perf_analyzer_configs/probes/op_count.py tells kernels, host ops and host
syncs apart.

    python -m perf_analyzer_configs.probes.delta_rule_ops              # one 512-token prompt
    python -m perf_analyzer_configs.probes.delta_rule_ops --lens 512 300 100 77 --shape qwen3.5-9b

The layer has the shape's widths and random weights; the input is its fused projection's output. It
runs as every layer after a forward's first: what a forward derives once for all its layers
(ForwardContext.memo: the delta rule's chunk layout) is made in the uncounted warm-up call.
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch import nn


def main() -> int:
    from transformers import Qwen3_5TextConfig

    from perf_analyzer_configs.benchmarks.ar_checkpoints import SHAPES
    from perf_analyzer_configs.probes.op_count import count
    from triton_omni.models.context import ForwardContext
    from triton_omni.models.qwen3_5 import Qwen3_5GatedDeltaNet

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3.5-0.8b", choices=[k for k, v in SHAPES.items() if "linear_num_key_heads" in v])
    ap.add_argument("--lens", nargs="+", type=int, default=[512], help="packed prompt lengths")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    config = Qwen3_5TextConfig(**{k: v for k, v in SHAPES[args.shape].items() if k != "model_type"})
    torch.manual_seed(0)
    layer = Qwen3_5GatedDeltaNet(config).eval()
    spec, S, T = layer.cache_spec(), len(args.lens), sum(args.lens)
    layer.conv_state = torch.zeros(S, *spec.conv_shape)
    layer.ssm_state = torch.zeros(S, *spec.state_shape)
    # the layer's inputs and caches, held as buffers: op_count takes a model's tensors for the device's
    inputs = nn.Module()
    for name, t in {"layer_conv_state": layer.conv_state, "layer_ssm_state": layer.ssm_state,
                    "x": 0.3 * torch.randn(T, sum(layer.in_proj.out_sizes)),
                    "positions": torch.cat([torch.arange(n) for n in args.lens]),
                    "slots": torch.zeros(T, dtype=torch.long), "state_slots": torch.arange(S),
                    "cu_seqlens": torch.tensor([0, *args.lens]).cumsum(0).int()}.items():
        inputs.register_buffer(name, t)
    inputs.layer = layer
    ctx = ForwardContext(is_prefill=True, slot_mapping=inputs.slots, state_slots=inputs.state_slots,
                         seq_lens=list(args.lens), cu_seqlens=inputs.cu_seqlens, max_seqlen=max(args.lens))
    print(f"{args.shape}: {config.layer_types.count('linear_attention')} DeltaNet layers; prompts {args.lens}")
    with torch.inference_mode():
        count(inputs, lambda: layer(inputs.x, inputs.positions, ctx), "one DeltaNet layer's prefill", args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
