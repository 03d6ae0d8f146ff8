"""Qwen3 (dense) decoder for the AR engine; parameter names match `Qwen3ForCausalLM` checkpoints.
The Llama layer with an RMSNorm per head on q and k."""
from __future__ import annotations

from triton_omni.models.decoder import CausalLM, DecoderModel, dense_layer


class Qwen3ForCausalLM(CausalLM):
    def __init__(self, config):
        super().__init__(config, DecoderModel(config, lambda i, rotary: dense_layer(config, rotary, qk_norm=True)))


class Qwen3ASRDecoder(Qwen3ForCausalLM):
    """The Qwen3 decoder of a Qwen3-ASR checkpoint (`Qwen3ASRForConditionalGeneration`: the language model
    under model.language_model.*, lm_head tied); its audio encoder is asr/qwen3_asr's."""

    rename = {"model.language_model.": "model."}
    skip_prefixes = ("model.audio_tower.", "model.multi_modal_projector.")
