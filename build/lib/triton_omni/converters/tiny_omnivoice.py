"""A tiny random OmniVoice checkpoint (see converters/tiny.py) in the release layout of k2-fsa/OmniVoice:

    config.json             model_type "omnivoice": audio_vocab_size, audio_mask_id, num_audio_codebook,
                            audio_codebook_weights, llm_config (a Qwen3 config)
    model.safetensors       llm.* (Qwen3Model), audio_embeddings.weight, audio_heads.weight,
                            codebook_layer_offsets (the package's persistent buffer)
    tokenizer files         a byte-level BPE with OmniVoice's prompt tokens (<|text_start|>, ...)
    audio_tokenizer/        transformers' HiggsAudioV2TokenizerModel layout: config.json (DAC acoustic +
                            HuBERT semantic sub-configs), model.safetensors, preprocessor_config.json

transformers' HiggsAudioV2TokenizerModel imports torchaudio, which this environment does not have, so
the codec's state dict is assembled from the same parts (DAC encoder/decoder, HuBERT, the semantic
conv stacks of python_backends/tts/omnivoice/codec.py) under the model's parameter names. The reference
package loads the folder with nothing missing or unexpected (tests/test_tts_omnivoice.py checks).
The codec keeps the release's rates (24 kHz, 960 samples a frame = 25 Hz, HuBERT at 16 kHz) and its
8 quantizers at the highest bandwidth (2 kbps), with tiny widths. Both halves have random weights:
the decoder speaks, and the encoder (voice cloning) maps a clip's frames onto varied codes.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

PROMPT_TOKENS = ["<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>", "<|instruct_end|>",
                 "<|text_start|>", "<|text_end|>"]
AUDIO = {"audio_vocab_size": 1025, "audio_mask_id": 1024, "num_audio_codebook": 8,
         "audio_codebook_weights": [8, 8, 6, 6, 4, 4, 2, 2]}
CODEC_TINY_CONFIG = {
    "model_type": "higgs_audio_v2_tokenizer",
    "sample_rate": 24000, "semantic_sample_rate": 16000, "downsample_factor": 320,
    "codebook_size": 1024, "codebook_dim": 8, "target_bandwidths": [0.5, 1, 1.5, 2],
    "kernel_size": 3, "unit_kernel_size": 3, "strides": [1, 1], "channel_ratios": [1, 1], "block_dilations": [1, 1],
    "acoustic_model_config": {"model_type": "dac", "encoder_hidden_size": 4, "hidden_size": 16,
                              "decoder_hidden_size": 64, "downsampling_ratios": [8, 5, 4, 2, 3],
                              "upsampling_ratios": [8, 5, 4, 2, 3], "sampling_rate": 24000, "n_codebooks": 9,
                              "codebook_size": 1024, "codebook_dim": 8},
    "semantic_model_config": {"model_type": "hubert", "hidden_size": 16, "num_hidden_layers": 1,
                              "num_attention_heads": 2, "intermediate_size": 32, "conv_dim": [8] * 7,
                              "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2,
                              "mask_time_prob": 0.0},
}


def omnivoice_tokenizer(out: Path):
    from triton_omni.converters.tiny_common import CORPUS, train_bpe

    fast = train_bpe(CORPUS * 4 + ["female, male, british accent, low pitch, [laughter] [sigh]"] * 4, PROMPT_TOKENS)
    fast.save_pretrained(str(out))
    return fast


def codec_state_dict(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """HiggsAudioV2TokenizerModel's parameters and buffers, random, by the names that model has."""
    from transformers import DacConfig, DacModel, HubertConfig, HubertModel

    from triton_omni.tts.omnivoice.codec import SemanticDecoder, SemanticEncoder, codec_sizes

    torch.manual_seed(seed)
    sizes = codec_sizes(config)
    acoustic = DacModel(DacConfig(**{k: v for k, v in config["acoustic_model_config"].items() if k != "model_type"}))
    semantic = HubertModel(HubertConfig(**{k: v for k, v in config["semantic_model_config"].items()
                                           if k != "model_type"}))
    parts = {"acoustic_encoder": acoustic.encoder, "acoustic_decoder": acoustic.decoder,
             "encoder_semantic": SemanticEncoder(config), "decoder_semantic": SemanticDecoder(config),
             "semantic_model": semantic,
             "fc": torch.nn.Linear(sizes.hidden, sizes.hidden),
             "fc1": torch.nn.Linear(sizes.hidden, sizes.semantic_hidden),
             "fc2": torch.nn.Linear(sizes.hidden, sizes.acoustic_hidden)}
    state = {f"{name}.{k}": v for name, part in parts.items() for k, v in part.state_dict().items()}
    state.pop("semantic_model.masked_spec_embed", None)        # the model ignores it on load
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, v in state.items():                             # DAC's convs start at ~0: make them speak
            if k.startswith("acoustic_decoder.") and k.endswith("weight") and v.dim() == 3:
                v.copy_(torch.randn(v.shape, generator=g) * (1.0 / (v.shape[1] * v.shape[2]) ** 0.5))
        state["acoustic_decoder.conv2.weight"] *= 0.003        # the waveform then within about [-1, 1]
        for q in range(sizes.num_quantizers):
            p = f"quantizer.quantizers.{q}."
            state[p + "codebook.inited"] = torch.tensor([1.0])
            state[p + "codebook.cluster_size"] = torch.ones(config["codebook_size"])
            state[p + "codebook.embed"] = torch.randn(config["codebook_size"], config["codebook_dim"], generator=g)
            state[p + "codebook.embed_avg"] = state[p + "codebook.embed"].clone()
            for name, (n_out, n_in) in (("project_in", (config["codebook_dim"], sizes.hidden)),
                                        ("project_out", (sizes.hidden, config["codebook_dim"]))):
                state[p + f"{name}.weight"] = torch.randn(n_out, n_in, generator=g) / n_in ** 0.5
                state[p + f"{name}.bias"] = 0.1 * torch.randn(n_out, generator=g)
        # the DAC encoder too (voice cloning encodes reference clips): otherwise its output is ~1e-6 and
        # a clip's frames all land on a few codes; its own generator, so the decoder's draws stay as they were
        g = torch.Generator().manual_seed(seed + 1)
        for k, v in state.items():
            if k.startswith("acoustic_encoder.") and k.endswith("weight") and v.dim() == 3:
                v.copy_(torch.randn(v.shape, generator=g) * (1.0 / (v.shape[1] * v.shape[2]) ** 0.5))
        state["acoustic_encoder.conv2.weight"] *= 0.05
    return {k: v.contiguous() for k, v in state.items()}


def omnivoice(out: Path, seed: int = 23) -> None:
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3Model

    from triton_omni.converters.tiny_common import randomize

    tokenizer = omnivoice_tokenizer(out)
    # the embedding table is larger than the tokenizer (as Qwen3's): the release embeds every position
    # as text too, audio codes (up to the mask id 1024) included, and then keeps only the audio sum there
    llm_config = Qwen3Config(vocab_size=1536, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    llm = Qwen3Model(llm_config)
    randomize(llm, seed=seed, std=0.25)
    g = torch.Generator().manual_seed(seed + 1)
    rows, hidden = AUDIO["num_audio_codebook"] * AUDIO["audio_vocab_size"], llm_config.hidden_size
    state = {f"llm.{k}": v.contiguous() for k, v in llm.state_dict().items()}
    state["audio_embeddings.weight"] = 0.25 * torch.randn(rows, hidden, generator=g)
    # the heads make confident, varied predictions (the decode loop reads their log-probabilities)
    state["audio_heads.weight"] = 0.5 * torch.randn(rows, hidden, generator=g)
    state["codebook_layer_offsets"] = torch.arange(AUDIO["num_audio_codebook"]) * AUDIO["audio_vocab_size"]
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["OmniVoice"], "model_type": "omnivoice", "dtype": "float32", **AUDIO,
              "llm_config": llm_config.to_dict()}
    (out / "config.json").write_text(json.dumps(config, indent=2))

    codec = out / "audio_tokenizer"
    codec.mkdir()
    save_file(codec_state_dict(CODEC_TINY_CONFIG, seed + 2), str(codec / "model.safetensors"),
              metadata={"format": "pt"})
    (codec / "config.json").write_text(json.dumps({"architectures": ["HiggsAudioV2TokenizerModel"],
                                                   **CODEC_TINY_CONFIG}, indent=2))
    (codec / "preprocessor_config.json").write_text(json.dumps(
        {"feature_extractor_type": "DacFeatureExtractor", "feature_size": 1, "hop_length": 960,
         "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000},
        indent=2))


BUILDERS: dict = {"omnivoice": omnivoice}
