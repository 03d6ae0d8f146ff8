"""Qwen3.5-MoE text decoder for the AR engine; parameter names match `Qwen3_5MoeForCausalLM`
checkpoints (and the language model inside `Qwen3_5MoeForConditionalGeneration` ones, e.g.
Qwen3.5-35B-A3B), experts stored stacked or one tensor per expert.

Qwen3.5's hybrid of Gated DeltaNet and gated attention layers (models/qwen3_5.py) with a sparse MoE
MLP in every layer (models/moe.py): softmax router, top k always renormalised, and a shared expert
every token goes through, scaled by sigmoid of its own gate logit.
"""
from __future__ import annotations

from triton_omni.models.decoder import CausalLM, DecoderModel
from triton_omni.models.moe import MOE_PACKED, SparseMoeBlock
from triton_omni.models.qwen3_5 import Qwen3_5ForCausalLM, qwen3_5_layer


class Qwen3_5MoeForCausalLM(CausalLM):
    packed = {**MOE_PACKED, **Qwen3_5ForCausalLM.packed}
    rename = Qwen3_5ForCausalLM.rename
    skip_prefixes = Qwen3_5ForCausalLM.skip_prefixes

    def __init__(self, config):
        super().__init__(config, DecoderModel(config, lambda i, rotary: qwen3_5_layer(
            config, config.layer_types[i], rotary, SparseMoeBlock.from_config(config, shared=True)), zero_centered=True))
