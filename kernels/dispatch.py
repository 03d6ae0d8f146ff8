"""Which implementation runs each hot operation: its Triton kernel (CUDA tensors, when enabled) or its
torch path, chosen per call by one decorator (`routed`), and the environment switches that steer it.

The engine turns kernels on for CUDA (`enable(True)`); CPU runs always take the torch path. The kernels
live by family, each module beside its torch reference (kernels/<family>.py, kernels/<family>_reference.py);
the ops below keep the names the models call.
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Callable

import torch
import torch.nn.functional as F

from triton_omni.kernels import (attention_reference, fp8_matmul_reference, fp8_scaled_mm, gated_delta_reference,
                                 moe_reference, norms_reference)

# ------------------------------------------------------------------ switches (read once, at import)

# Triton's interpreter runs the kernels on the CPU (the tests); it is chosen before triton is imported.
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
# Programmatic dependent launch of the decode kernels (kernels.triton_helpers): on unless
# TRITON_OMNI_PDL=0 (or this is cleared); the interpreter runs no launch attributes.
PDL = os.environ.get("TRITON_OMNI_PDL", "1") != "0" and not INTERPRETER
# The prefill kernels of the delta rule pass their tests (tests/test_kernels_gated_delta.py) but have not
# been timed against the torch path on the GPU yet: off unless TRITON_OMNI_DELTA_RULE_KERNEL=1 (or this is set).
DELTA_RULE_KERNEL = os.environ.get("TRITON_OMNI_DELTA_RULE_KERNEL", "0") == "1"

_enabled = False
ROUTES: list[tuple[Callable, str, str]] = []     # each routed op: (its torch path, its kernel's module, name)


def enable(on: bool = True) -> None:
    """Use the Triton kernels for CUDA tensors (needs the `triton` package)."""
    global _enabled
    if on:
        for module in sorted({module for _, module, _ in ROUTES}):
            importlib.import_module(module)     # fail here, not in the middle of a forward pass
    _enabled = on


def enabled() -> bool:
    return _enabled


@functools.lru_cache(maxsize=None)
def _kernel(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def routed(module: str, kernel: str | None = None, applies=None):
    """Make an op's torch path (its reference, or a composite of other ops) the public op, which picks
    per call: the Triton kernel `kernel` (by default the op's own name) of `module`, called with the same
    arguments, when kernels are enabled, the first argument is a CUDA tensor and `applies(*args,
    **kwargs)` holds (the shapes and dtypes the kernel takes, where it takes fewer); the torch path
    otherwise. The kernel's module is imported on its first call (it needs `triton`)."""
    def wrap(torch_path):
        name = kernel or torch_path.__name__
        ROUTES.append((torch_path, module, name))

        @functools.wraps(torch_path)
        def op(*args, **kwargs):
            if _enabled and args[0].is_cuda and (applies is None or applies(*args, **kwargs)):
                return _kernel(module, name)(*args, **kwargs)
            return torch_path(*args, **kwargs)
        return op
    return wrap


NORMS, DECODE_MATMUL, ATTENTION, GATED_DELTA, FP8_MATMUL, MOE = (
    f"triton_omni.kernels.{family}" for family in ("norms", "decode_matmul", "attention", "gated_delta", "fp8_matmul",
                                                   "moe"))

rms_norm = routed(NORMS)(norms_reference.rms_norm)
silu_and_mul = routed(NORMS)(norms_reference.silu_and_mul)
qk_norm_rope_store = routed(ATTENTION, applies=lambda q, k, v, q_weight, *args, **kwargs: (
    q_weight is None or q_weight.dtype == q.dtype))(attention_reference.qk_norm_rope_store)
paged_decode_attention = routed(ATTENTION)(attention_reference.paged_decode_attention)
causal_conv1d_prefill = routed(GATED_DELTA)(gated_delta_reference.causal_conv1d_prefill)
causal_conv1d_update = routed(GATED_DELTA)(gated_delta_reference.causal_conv1d_update)
gated_delta_decode = routed(GATED_DELTA)(gated_delta_reference.gated_delta_decode)
# a sparse MoE block after its router matmul: routing, the experts, the shared expert (kernels/moe.py)
sparse_moe = routed(MOE)(moe_reference.sparse_moe)


def _one_16bit_row(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Batch-1 decode, 16-bit: where the skinny kernels beat cuBLAS."""
    return x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype


@routed(DECODE_MATMUL, "skinny_linear", applies=lambda x, weight, *args, **kwargs: _one_16bit_row(x, weight))
def linear(x, weight, bias=None, gated=False):
    """x @ weight.T (+ bias), `gated`: of silu(gate) * up of a fused [gate | up] x. One 16-bit row
    (batch-1 decode) runs the skinny Triton kernel; everything else cuBLAS."""
    return F.linear(silu_and_mul(x) if gated else x, weight, bias)


# Folding the norm into the matmul makes every program read the whole row once more before its weights:
# a gain at hidden size 1024 (H200, bench_decode_matmul.py, Qwen3-0.6B: q/k/v 6.9 -> 4.9 us, gate/up
# 7.6 -> 5.9, cuBLAS with the norm kernel against the fold; c=1 decode 951 -> 1,020 tokens/s), none at
# 4096 (Qwen3-8B: 18.3 vs 18.1 and 51.9 vs 51.8 us; c=1 decode 212 tokens/s with it, 217 without),
# so only up to this input width.
NORM_FOLD_MAX_K = 2048


def _norm_folds(x, residual, norm_weight, eps, zero_centered, weight, bias=None) -> bool:
    return _one_16bit_row(x, weight) and x.shape[1] <= NORM_FOLD_MAX_K and norm_weight.dtype == x.dtype


@routed(DECODE_MATMUL, "skinny_norm_linear", applies=_norm_folds)
def norm_linear(x, residual, norm_weight, eps, zero_centered, weight, bias=None):
    """linear(rms_norm(x [+ residual])) and the new residual (x + residual; x itself without one).
    One 16-bit row of width <= NORM_FOLD_MAX_K: one skinny kernel (the norm folded in); otherwise the
    norm, then `linear`."""
    if residual is None:
        return linear(rms_norm(x, norm_weight, eps, None, zero_centered), weight, bias), x
    h, residual = rms_norm(x, norm_weight, eps, residual, zero_centered)
    return linear(h, weight, bias), residual


def folds_norm(x, norm_weight, weight) -> bool:
    """Whether norm_linear(x, ...) with these weights folds the norm into its matmul on this call (so a
    caller that needs the normalised input too can leave the norm to the next kernel as well)."""
    return _enabled and x.is_cuda and _norm_folds(x, None, norm_weight, 0.0, False, weight)


# --- FP8 weights (E4M3 values and float32 scales, kernels/fp8_matmul_reference.py; models/quant.py makes them)

quantize_rows = routed(FP8_MATMUL)(fp8_matmul_reference.quantize_rows)


def _one_16bit_fp8_row(x, weight, *args, **kwargs) -> bool:
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == fp8_matmul_reference.FP8)


@routed(FP8_MATMUL, "skinny_fp8_linear", applies=_one_16bit_fp8_row)
def fp8_linear(x, weight, scale, bias=None, gated=False):
    """x @ (weight * scale).T (+ bias) for FP8 weights. One 16-bit row on CUDA (batch-1 decode): the
    skinny FP8 kernel, weights dequantized in registers; more rows: the rows quantized to FP8 as well,
    torch._scaled_mm on CUDA (kernels/fp8_scaled_mm.py); one row on the CPU: the weight-only reference,
    what the kernel computes."""
    if x.shape[0] == 1 and not x.is_cuda:
        return fp8_matmul_reference.fp8_linear(x, weight, scale, bias, gated)
    return fp8_scaled_mm.scaled_mm_linear(x, weight, scale, bias, gated, rows=quantize_rows)


def _fp8_norm_folds(x, residual, norm_weight, eps, zero_centered, weight, scale, bias=None) -> bool:
    return _one_16bit_fp8_row(x, weight) and x.shape[1] <= NORM_FOLD_MAX_K and norm_weight.dtype == x.dtype


@routed(FP8_MATMUL, "skinny_fp8_norm_linear", applies=_fp8_norm_folds)
def fp8_norm_linear(x, residual, norm_weight, eps, zero_centered, weight, scale, bias=None):
    """norm_linear for FP8 weights: one skinny FP8 kernel with the norm folded in where norm_linear
    folds it; otherwise the norm, then `fp8_linear`."""
    if residual is None:
        return fp8_linear(rms_norm(x, norm_weight, eps, None, zero_centered), weight, scale, bias), x
    h, residual = rms_norm(x, norm_weight, eps, residual, zero_centered)
    return fp8_linear(h, weight, scale, bias), residual


def delta_rule_kernel(device) -> bool:
    """Whether the delta rule's prefill takes its Triton kernels on `device` (their chunk table is built
    on the device, so a prefill CUDA graph can hold them; the torch path loops on the host)."""
    return _enabled and DELTA_RULE_KERNEL and torch.device(device).type == "cuda"


def gated_delta_chunks(cu_seqlens, seq_lens, num_tokens):
    """How gated_delta_prefill cuts the packed prompts into chunks, the same for every layer of a
    forward: the kernels' GatedDeltaChunks from cu_seqlens [S + 1] (device) and a bound on the tokens,
    or the torch path's ChunkLayout from the host lengths `seq_lens`."""
    if delta_rule_kernel(cu_seqlens.device):
        return _kernel(GATED_DELTA, "GatedDeltaChunks").of(cu_seqlens, num_tokens)
    return gated_delta_reference.ChunkLayout.build(seq_lens, gated_delta_reference.DELTA_CHUNK, cu_seqlens.device)


def gated_delta_prefill(q, k, v, a, b, A_log, dt_bias, chunks, state, slots):
    """The delta rule over the packed prompts (see gated_delta_reference.gated_delta_prefill): returns the
    outputs [T, Hv, dv] fp32 and leaves prompt s's last state in state[slots[s]]."""
    if isinstance(chunks, gated_delta_reference.ChunkLayout):
        out, states = gated_delta_reference.gated_delta_prefill(q, k, v, a, b, A_log, dt_bias, chunks)
        state.index_copy_(0, slots, states)
        return out
    return _kernel(GATED_DELTA, "gated_delta_prefill")(q, k, v, a, b, A_log, dt_bias, chunks, state, slots)


@functools.lru_cache(maxsize=None)
def varlen_attention_supported(dtype: torch.dtype, head_dim: int, device) -> bool:
    """Whether `prefill_attention` can take the packed (varlen) flash kernel: one launch for every
    prompt of a step, cu_seqlens on the device, hence capturable in a CUDA graph."""
    d = torch.device(device)
    return (d.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0 and head_dim <= 256
            and torch.cuda.get_device_capability(d)[0] >= 8 and hasattr(torch.ops.aten, "_flash_attention_forward"))


def prefill_attention(q, k, v, seq_lens, scale, cu_seqlens=None, max_seqlen=0):
    """Causal attention within each packed prompt. `seq_lens`: host lengths (the reference path);
    `cu_seqlens` [B + 1] int32 on the device with `max_seqlen` a host bound on every length: the varlen
    flash kernel (GQA native), where it applies. Padding may be packed as sequences of its own."""
    if cu_seqlens is not None and max_seqlen > 0 and q.is_cuda and varlen_attention_supported(q.dtype, q.shape[-1], q.device):
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                       0.0, True, False, scale=scale)[0]
    if not q.is_cuda:
        if seq_lens is None:        # a prefill graph's layout, run eagerly on a CPU (tests)
            seq_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        return attention_reference.prefill_attention(q, k, v, seq_lens, scale)
    # The reference's 3-D, enable_gqa call takes torch's math path on CUDA (~0.4 ms of host time per
    # layer); 4-D with the key/value heads repeated, it runs a fused kernel (fp32 included).
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out, start = [], 0
    for n in seq_lens:
        qs, ks, vs = (t[start:start + n].transpose(0, 1)[None] for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)[0].transpose(0, 1))
        start += n
    return torch.cat(out, dim=0)


def prefill_attention_with_prefix(q, k_cache, v_cache, block_tables, context_lens, seq_lens, prefix_lens, scale,
                                  cu_seqlens=None, max_context_len=0):
    """Causal attention of packed prompt tails over their whole prompts in the paged cache (see
    attention_reference.prefill_attention_with_prefix). On CUDA, with the varlen flash kernel: each
    prompt's K/V gathered from its blocks into one packed tensor, then one launch whose causal mask is
    aligned to each sequence's end (flash's convention when a sequence has fewer queries than keys)."""
    if not (q.is_cuda and cu_seqlens is not None and varlen_attention_supported(q.dtype, q.shape[-1], q.device)):
        return attention_reference.prefill_attention_with_prefix(q, k_cache, v_cache, block_tables, context_lens,
                                                                 seq_lens, prefix_lens, scale)
    block_size, Hk, D = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    total = sum(seq_lens) + sum(prefix_lens)
    lens = context_lens.long()
    cu_k = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=q.device)
    torch.cumsum(context_lens, 0, out=cu_k[1:])
    seq_of = torch.repeat_interleave(torch.arange(len(seq_lens), device=q.device), lens, output_size=total)
    pos = torch.arange(total, device=q.device) - cu_k[:-1].long()[seq_of]
    slots = block_tables[seq_of, pos // block_size].long() * block_size + pos % block_size
    k, v = k_cache.view(-1, Hk, D)[slots], v_cache.view(-1, Hk, D)[slots]
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_k, max(seq_lens), max_context_len,
                                                   0.0, True, False, scale=scale)[0]
