"""Qwen3 (dense) decoder for the AR engine; parameter names match `Qwen3ForCausalLM` checkpoints.
The Llama layer with an RMSNorm per head on q and k."""
from __future__ import annotations

from triton_omni.models.decoder import CausalLM, DecoderModel, dense_layer


class Qwen3ForCausalLM(CausalLM):
    def __init__(self, config):
        super().__init__(config, DecoderModel(config, lambda i, rotary: dense_layer(config, rotary, qk_norm=True)))
