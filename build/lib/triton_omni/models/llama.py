"""Llama (1/2/3) decoder for the AR engine; parameter names match `LlamaForCausalLM` checkpoints.

Rope comes from `rope_inv_freq`, which covers Llama 3's frequency-dependent scaling ("llama3") as
well as plain rope. `attention_bias` puts biases on q/k/v/o, `mlp_bias` on gate/up/down, as in
transformers. Talkers such as Orpheus are Llama checkpoints.
"""
from __future__ import annotations

from triton_omni.models.decoder import CausalLM, DecoderModel, dense_layer


class LlamaForCausalLM(CausalLM):
    def __init__(self, config):
        super().__init__(config, DecoderModel(config, lambda i, rotary: dense_layer(config, rotary, qk_norm=False)))
