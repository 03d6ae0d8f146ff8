"""Route each hot operation to its Triton kernel (CUDA tensors, when enabled) or its torch reference.

The engine turns kernels on for CUDA (`enable(True)`); CPU runs always take the reference path.
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from triton_omni.kernels import reference

_enabled = False


def enable(on: bool = True) -> None:
    """Use the Triton kernels for CUDA tensors (needs the `triton` package)."""
    global _enabled
    if on:
        import triton_omni.kernels.triton_ops  # noqa: F401 - fail here, not in the middle of a forward pass
    _enabled = on


def enabled() -> bool:
    return _enabled


def _kernel(x: torch.Tensor):
    if _enabled and x.is_cuda:
        import triton_omni.kernels.triton_ops as ops

        return ops
    return None


def rms_norm(x, weight, eps, residual=None, zero_centered=False):
    ops = _kernel(x)
    if ops is not None and hasattr(ops, "rms_norm"):
        return ops.rms_norm(x, weight, eps, residual, zero_centered)
    return reference.rms_norm(x, weight, eps, residual, zero_centered)


def silu_and_mul(x):
    ops = _kernel(x)
    if ops is not None and hasattr(ops, "silu_and_mul"):
        return ops.silu_and_mul(x)
    return reference.silu_and_mul(x)


def linear(x, weight, bias=None, gated=False):
    """x @ weight.T (+ bias), `gated`: of silu(gate) * up of a fused [gate | up] x. One 16-bit row
    (batch-1 decode) runs the skinny Triton kernel; everything else cuBLAS."""
    ops = _kernel(x)
    if (ops is not None and x.dim() == 2 and x.shape[0] == 1
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype):
        return ops.skinny_linear(x, weight, bias, gated)
    return F.linear(silu_and_mul(x) if gated else x, weight, bias)


# Folding the norm into the matmul makes every program read the whole row once more before its weights:
# a gain at hidden size 1024 (H200, bench_decode_matmul.py, Qwen3-0.6B: q/k/v 6.9 -> 4.9 us, gate/up
# 7.6 -> 5.9, cuBLAS with the norm kernel against the fold; c=1 decode 951 -> 1,020 tokens/s), none at
# 4096 (Qwen3-8B: 18.3 vs 18.1 and 51.9 vs 51.8 us; c=1 decode 212 tokens/s with it, 217 without),
# so only up to this input width.
NORM_FOLD_MAX_K = 2048


def norm_linear(x, residual, norm_weight, eps, zero_centered, weight, bias=None):
    """linear(rms_norm(x [+ residual])) and the new residual (x + residual; x itself without one).
    One 16-bit row of width <= NORM_FOLD_MAX_K: one skinny kernel (the norm folded in); otherwise the
    norm, then `linear`."""
    ops = _kernel(x)
    if (ops is not None and x.dim() == 2 and x.shape[0] == 1 and x.shape[1] <= NORM_FOLD_MAX_K
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and norm_weight.dtype == x.dtype):
        return ops.skinny_norm_linear(x, residual, norm_weight, eps, zero_centered, weight, bias)
    if residual is None:
        return linear(rms_norm(x, norm_weight, eps, None, zero_centered), weight, bias), x
    h, residual = rms_norm(x, norm_weight, eps, residual, zero_centered)
    return linear(h, weight, bias), residual


def qk_norm_rope_store(q, k, v, q_weight, k_weight, eps, zero_centered, cos, sin, positions,
                       k_cache, v_cache, slot_mapping):
    ops = _kernel(q)
    if ops is not None and hasattr(ops, "qk_norm_rope_store") and (q_weight is None or q_weight.dtype == q.dtype):
        return ops.qk_norm_rope_store(q, k, v, q_weight, k_weight, eps, zero_centered, cos, sin, positions,
                                      k_cache, v_cache, slot_mapping)
    return reference.qk_norm_rope_store(q, k, v, q_weight, k_weight, eps, zero_centered, cos, sin, positions,
                                        k_cache, v_cache, slot_mapping)


def causal_conv1d_prefill(x, weight, positions):
    ops = _kernel(x)
    if ops is not None and hasattr(ops, "causal_conv1d_prefill"):
        return ops.causal_conv1d_prefill(x, weight, positions)
    return reference.causal_conv1d_prefill(x, weight, positions)


def causal_conv1d_update(x, conv_state, weight, slots):
    ops = _kernel(x)
    if ops is not None and hasattr(ops, "causal_conv1d_update"):
        return ops.causal_conv1d_update(x, conv_state, weight, slots)
    return reference.causal_conv1d_update(x, conv_state, weight, slots)


def gated_delta_decode(q, k, v, a, b, A_log, dt_bias, state, slots, z, norm_weight, eps):
    ops = _kernel(q)
    if ops is not None and hasattr(ops, "gated_delta_decode"):
        return ops.gated_delta_decode(q, k, v, a, b, A_log, dt_bias, state, slots, z, norm_weight, eps)
    return reference.gated_delta_decode(q, k, v, a, b, A_log, dt_bias, state, slots, z, norm_weight, eps)


# The prefill kernels of the delta rule pass their tests (tests/test_kernels.py) but have not been timed
# against the torch path on the GPU yet: off unless TRITON_OMNI_DELTA_RULE_KERNEL=1 (or this is set).
DELTA_RULE_KERNEL = os.environ.get("TRITON_OMNI_DELTA_RULE_KERNEL", "0") == "1"


def delta_rule_kernel(device) -> bool:
    """Whether the delta rule's prefill takes its Triton kernels on `device` (their chunk table is built
    on the device, so a prefill CUDA graph can hold them; the torch path loops on the host)."""
    return _enabled and DELTA_RULE_KERNEL and torch.device(device).type == "cuda"


def gated_delta_chunks(cu_seqlens, seq_lens, num_tokens):
    """How gated_delta_prefill cuts the packed prompts into chunks, the same for every layer of a
    forward: the kernels' GatedDeltaChunks from cu_seqlens [S + 1] (device) and a bound on the tokens,
    or the torch path's ChunkLayout from the host lengths `seq_lens`."""
    if delta_rule_kernel(cu_seqlens.device):
        import triton_omni.kernels.triton_ops as ops

        return ops.GatedDeltaChunks.of(cu_seqlens, num_tokens)
    return reference.ChunkLayout.build(seq_lens, reference.DELTA_CHUNK, cu_seqlens.device)


def gated_delta_prefill(q, k, v, a, b, A_log, dt_bias, chunks, state, slots):
    """The delta rule over the packed prompts (see reference.gated_delta_prefill): returns the outputs
    [T, Hv, dv] fp32 and leaves prompt s's last state in state[slots[s]]."""
    if isinstance(chunks, reference.ChunkLayout):
        out, states = reference.gated_delta_prefill(q, k, v, a, b, A_log, dt_bias, chunks)
        state.index_copy_(0, slots, states)
        return out
    import triton_omni.kernels.triton_ops as ops

    return ops.gated_delta_prefill(q, k, v, a, b, A_log, dt_bias, chunks, state, slots)


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, max_context_len):
    ops = _kernel(q)
    if ops is not None and hasattr(ops, "paged_decode_attention"):
        return ops.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
    return reference.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, max_context_len)


def argmax(x):
    """The first index of each row's maximum: x [B, V] -> int64 [B]."""
    ops = _kernel(x)
    return ops.argmax(x) if ops is not None else x.argmax(-1)


def decode_inputs(rows, position, last_token, block_tables, scratch, block_size):
    ops = _kernel(rows)
    if ops is not None:
        return ops.decode_inputs(rows, position, last_token, block_tables, scratch, block_size)
    return reference.decode_inputs(rows, position, last_token, block_tables, scratch, block_size)


def decode_finish(tokens, rows, out_count, min_tokens, max_tokens, stop_ids, last_token, position, scratch, out,
                  advance, write_token):
    ops = _kernel(rows)
    if ops is not None:
        return ops.decode_finish(tokens, rows, out_count, min_tokens, max_tokens, stop_ids, last_token, position,
                                 scratch, out, advance, write_token)
    return reference.decode_finish(tokens, rows, out_count, min_tokens, max_tokens, stop_ids, last_token, position,
                                   scratch, out, advance, write_token)


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
        return reference.prefill_attention(q, k, v, seq_lens, scale)
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
