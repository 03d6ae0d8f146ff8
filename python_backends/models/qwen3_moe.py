"""Qwen3-MoE decoder for the AR engine; parameter names match `Qwen3MoeForCausalLM` checkpoints (one
tensor per expert, as the released Qwen3-30B-A3B / 235B-A22B are stored, or stacked as transformers 5
keeps them in memory).

Qwen3's attention (RMSNorm per head on q and k) with a sparse MoE MLP (models/moe.py) in every layer
but those `mlp_only_layers` lists and those off the `decoder_sparse_step` stride, which keep a dense
gated MLP. The router's top k are renormalised when `norm_topk_prob`.
"""
from __future__ import annotations

from triton_omni.models.decoder import PACKED, Attention, CausalLM, DecoderLayer, DecoderModel
from triton_omni.models.layers import GatedMLP, RotaryEmbedding
from triton_omni.models.moe import MOE_PACKED, SparseMoeBlock


def is_sparse(config, i: int) -> bool:
    """Whether layer i has experts (transformers' rule for Qwen3-MoE and Qwen3-Omni's thinker)."""
    return (i not in (config.mlp_only_layers or []) and config.num_experts > 0
            and (i + 1) % config.decoder_sparse_step == 0)


def qwen3_moe_layer(config, i: int, rotary: RotaryEmbedding) -> DecoderLayer:
    mlp = SparseMoeBlock.from_config(config, shared=False) if is_sparse(config, i) \
        else GatedMLP(config.hidden_size, config.intermediate_size)
    return DecoderLayer(config, Attention(config, rotary, qk_norm=True), mlp)


class Qwen3MoeForCausalLM(CausalLM):
    packed = {**MOE_PACKED, **PACKED}

    def __init__(self, config):
        super().__init__(config, DecoderModel(config, lambda i, rotary: qwen3_moe_layer(config, i, rotary)))
