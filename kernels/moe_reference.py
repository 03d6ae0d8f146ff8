"""Torch references of kernels.moe: the definition of what each mixture-of-experts kernel computes.

A sparse MoE block (Qwen3-MoE, Qwen3.5-MoE, Qwen3-Omni's thinker and talker) sends each token to
`top_k` of `E` experts, each a gated MLP down(silu(gate(h)) * up(h)), and sums their outputs weighted
by the router's probabilities: softmax over all E router logits, the top k kept, renormalised to sum 1
when the model says so (Qwen3-MoE's `norm_topk_prob`; Qwen3.5-MoE always). Some models add a shared
expert that every token goes through, scaled by sigmoid of its own gate logit.

Expert weights are stacked as transformers 5 keeps them: gate_up [E, 2I, H] (gate rows, then up rows)
and down [E, H, I]. The kernels first sort the (token, slot) pairs by expert (`align`): one group of
rows per expert, each padded to a multiple of the matmul's row tile, so that every tile of a grouped
matmul belongs to one expert.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from triton_omni.kernels.norms_reference import rms_norm, silu_and_mul


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] fp32, expert ids [T, k] int32), most probable first:
    softmax in fp32, the top k probabilities, divided by their sum when `renormalize`."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def padded_pairs(num_pairs: int, num_experts: int, block_m: int) -> int:
    """A bound on the sorted pairs with each expert's group padded to a multiple of block_m, known on
    the host before routing (so grids and buffers need no device-to-host copy): at most
    min(E, pairs) groups are non-empty, each with fewer than block_m padding rows."""
    rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-rows // block_m) * block_m


def align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The T * k (token, slot) pairs of ids [T, k] (pair p = t * k + slot) grouped by expert ->
    (sorted_pairs [P] int32, block_expert [P / block_m] int32), P = padded_pairs(...).

    Expert e's pairs, in increasing order, fill a group starting at a multiple of block_m, padded with
    the sentinel T * k; the groups follow each other by expert, empty experts take no room.
    block_expert[b] is the expert of row tile b, -1 past the last group (and past it sorted_pairs
    holds the sentinel)."""
    flat = ids.flatten().long()
    pairs, size = flat.numel(), padded_pairs(flat.numel(), num_experts, block_m)
    sorted_pairs = torch.full((size,), pairs, dtype=torch.int32, device=ids.device)
    block_expert = torch.full((size // block_m,), -1, dtype=torch.int32, device=ids.device)
    start = 0
    for e in range(num_experts):
        mine = (flat == e).nonzero()[:, 0]
        if mine.numel() == 0:
            continue
        sorted_pairs[start:start + mine.numel()] = mine.to(torch.int32)
        blocks = -(-mine.numel() // block_m)
        block_expert[start // block_m:start // block_m + blocks] = e
        start += blocks * block_m
    return sorted_pairs, block_expert


def expert_gate_up(h: torch.Tensor, gate_up: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Every pair's activation silu(gate) * up [T * k, I] (pair p = t * k + slot: token t through
    expert ids[t, slot]), each projection rounded to h's dtype as a linear is, then silu_and_mul."""
    top_k = ids.shape[1]
    flat = ids.flatten().long()
    act = h.new_empty((flat.numel(), gate_up.shape[1] // 2))
    for e in flat.unique().tolist():
        pairs = (flat == e).nonzero()[:, 0]
        act[pairs] = silu_and_mul(F.linear(h[pairs // top_k], gate_up[e]))
    return act


def expert_down(act: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each token's weighted sum over its k pairs of down(act) [T, H], in fp32."""
    T, top_k = ids.shape
    flat = ids.flatten().long()
    out = torch.zeros((T, down.shape[1]), dtype=torch.float32, device=act.device)
    w = weights.flatten().float()
    for e in flat.unique().tolist():
        pairs = (flat == e).nonzero()[:, 0]
        y = act[pairs].float() @ down[e].float().T
        out.index_add_(0, pairs // top_k, y * w[pairs, None])
    return out


def experts(h: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
            ids: torch.Tensor) -> torch.Tensor:
    """The routed experts' weighted sum for each token of h [T, H] -> [T, H] in h's dtype (summed in
    fp32, rounded once)."""
    return expert_down(expert_gate_up(h, gate_up, ids), down, weights, ids).to(h.dtype)


def shared_expert(gate: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """sigmoid(gate) * down(silu(gate_up's gate) * up), fp32 [T, H]: the shared expert of each token
    from its gate logit [T, 1] and its fused gate/up projection [T, 2Is]."""
    return torch.sigmoid(gate.float()) * F.linear(silu_and_mul(gate_up), down).float()


def sparse_moe(x: torch.Tensor, logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int,
               renormalize: bool, norm=None, shared=None) -> torch.Tensor:
    """A sparse MoE block after its router matmul: x [T, H] the block's input (with `norm` = (weight,
    eps, zero_centered): the hidden state before its RMSNorm, which is applied here first), logits
    [T, E] the router's; `shared` = (gate [T, 1], gate_up [T, 2Is], down [H, Is]) adds a shared
    expert. Returns [T, H] in x's dtype."""
    h = x if norm is None else rms_norm(x, norm[0], norm[1], None, norm[2])
    weights, ids = route(logits, top_k, renormalize)
    out = expert_down(expert_gate_up(h, gate_up, ids), down, weights, ids)
    if shared is not None:
        out = out + shared_expert(*shared)
    return out.to(x.dtype)
