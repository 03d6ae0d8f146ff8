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


class OmniASRDecoder(LlamaForCausalLM):
    """The Llama decoder of an Omnilingual ASR LLM checkpoint (`OmniASRForConditionalGeneration`: the
    language model under model.language_model.*); its audio encoder is asr/omniasr's."""

    rename = {"model.language_model.": "model."}
    skip_prefixes = ("model.audio_tower.", "model.multi_modal_projector.")


class HiggsAudioDecoder(LlamaForCausalLM):
    """The Llama decoder of a Higgs Audio checkpoint (boson-multimodal's `HiggsAudioModel`: decoder names at
    the top level, the text head in its audio_decoder_proj). Its dual-FFN layers' audio path serves audio
    output tokens only, which a transcript has none of, so their text path is this Llama layer; the
    audio tower is asr/higgs_audio's."""

    rename = {"embed_tokens.": "model.embed_tokens.", "layers.": "model.layers.", "norm.": "model.norm.",
              "audio_decoder_proj.text_lm_head.": "lm_head."}
    skip_prefixes = ("audio_tower.", "audio_encoder_proj.", "audio_codebook_embeddings.", "audio_decoder_proj.")
    skip_parts = (".audio_mlp.", ".audio_input_layernorm.", ".audio_post_attention_layernorm.", ".audio_attn.",
                  ".audio_post_audio_attn_layer_norm.")
