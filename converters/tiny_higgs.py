"""A tiny random Higgs Audio understanding checkpoint (see converters/tiny.py) in boson-multimodal's layout.

higgs_audio  `HiggsAudioModel.save_pretrained`'s files: config.json (model_type higgs_audio: its
             audio_encoder_config for the Whisper tower with the release's 128 mel bins and 1500 positions,
             a Llama text_config, the dual-FFN adapter of the releases with one dual layer, the audio token
             ids) and model.safetensors with its parameter names (audio_tower.*, audio_encoder_proj.linear,
             embed_tokens, layers.* with the dual layer's audio_mlp and norms, norm,
             audio_decoder_proj.text_lm_head / audio_lm_head, audio_codebook_embeddings), and a Llama-3-style
             byte-level tokenizer with the Higgs special tokens.

The package pins transformers 4.46, so the files are written here from the layout (names and shapes)
rather than by the package; the parity tests load them with the package's own `from_pretrained` in its
reference environment and check that every parameter is found (tests/test_asr_higgs.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|eom_id|>", "<|audio_bos|>", "<|audio_eos|>", "<|audio_out_bos|>", "<|AUDIO|>", "<|AUDIO_OUT|>"]
ENCODER = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32,
               max_source_positions=1500, activation_function="gelu", model_type="higgs_audio_encoder")
TEXT = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0)
DUAL_LAYERS = [1]
CODEBOOKS, CODEBOOK_SIZE = 4, 16


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from triton_omni.converters.tiny_common import CORPUS

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    prompts = ["What words do you hear from the provided audio? Write it down for me.", "Translate the speech into English.",
               "user", "assistant", "system"]
    bpe.train_from_iterator((CORPUS + prompts) * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<|end_of_text|>", additional_special_tokens=SPECIAL[2:])


def shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    """Every parameter of HiggsAudioModel at these sizes, by its name."""
    d, ffn = ENCODER["d_model"], ENCODER["encoder_ffn_dim"]
    h, inter = TEXT["hidden_size"], TEXT["intermediate_size"]
    q, kv = TEXT["num_attention_heads"] * TEXT["head_dim"], TEXT["num_key_value_heads"] * TEXT["head_dim"]
    out = {"audio_tower.conv1.weight": (d, ENCODER["num_mel_bins"], 3), "audio_tower.conv1.bias": (d,),
           "audio_tower.conv2.weight": (d, d, 3), "audio_tower.conv2.bias": (d,),
           "audio_tower.embed_positions.weight": (ENCODER["max_source_positions"], d),
           "audio_tower.layer_norm.weight": (d,), "audio_tower.layer_norm.bias": (d,),
           "audio_encoder_proj.linear.weight": (h, d), "audio_encoder_proj.linear.bias": (h,),
           "embed_tokens.weight": (vocab, h), "norm.weight": (h,),
           "audio_decoder_proj.text_lm_head.weight": (vocab, h),
           "audio_decoder_proj.audio_lm_head.weight": (CODEBOOKS * (CODEBOOK_SIZE + 2), h),
           "audio_codebook_embeddings.weight": (CODEBOOKS * (CODEBOOK_SIZE + 2), h)}
    for i in range(ENCODER["encoder_layers"]):
        p = f"audio_tower.layers.{i}."
        out.update({p + "self_attn.k_proj.weight": (d, d), p + "self_attn.v_proj.weight": (d, d), p + "self_attn.v_proj.bias": (d,),
                    p + "self_attn.q_proj.weight": (d, d), p + "self_attn.q_proj.bias": (d,),
                    p + "self_attn.out_proj.weight": (d, d), p + "self_attn.out_proj.bias": (d,),
                    p + "self_attn_layer_norm.weight": (d,), p + "self_attn_layer_norm.bias": (d,),
                    p + "fc1.weight": (ffn, d), p + "fc1.bias": (ffn,), p + "fc2.weight": (d, ffn), p + "fc2.bias": (d,),
                    p + "final_layer_norm.weight": (d,), p + "final_layer_norm.bias": (d,)})
    for i in range(TEXT["num_hidden_layers"]):
        p = f"layers.{i}."
        mlps = ["mlp.", "audio_mlp."] if i in DUAL_LAYERS else ["mlp."]
        out.update({p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                    p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        for m in mlps:
            out.update({p + m + "gate_proj.weight": (inter, h), p + m + "up_proj.weight": (inter, h),
                        p + m + "down_proj.weight": (h, inter)})
        if i in DUAL_LAYERS:
            out.update({p + "audio_input_layernorm.weight": (h,), p + "audio_post_attention_layernorm.weight": (h,)})
    return out


def higgs_audio(out: Path) -> None:
    from safetensors.torch import save_file

    tok = tokenizer()
    tok.save_pretrained(str(out))
    # the releases' class name (Llama 3's fast tokenizer), which transformers 4 (the package's) also reads
    meta = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**meta, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    token = tok.convert_tokens_to_ids
    vocab = len(tok)
    g = torch.Generator().manual_seed(33)
    tensors = {}
    for name, shape in shapes(vocab).items():
        if name.endswith(("norm.weight", "layernorm.weight")):
            tensors[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            tensors[name] = 0.3 * torch.randn(shape, generator=g)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["HiggsAudioModel"], "model_type": "higgs_audio",
              "audio_encoder_config": ENCODER, "text_config": {**TEXT, "vocab_size": vocab,
                                                               "bos_token_id": token("<|begin_of_text|>"),
                                                               "eos_token_id": token("<|eot_id|>"),
                                                               "pad_token_id": token("<|end_of_text|>")},
              "audio_adapter_type": "dual_ffn_fast_forward", "audio_dual_ffn_layers": DUAL_LAYERS,
              "audio_ffn_hidden_size": TEXT["hidden_size"], "audio_ffn_intermediate_size": TEXT["intermediate_size"],
              "encode_whisper_embed": True, "encode_audio_in_tokens": False, "skip_audio_tower": False,
              "use_delay_pattern": True, "audio_num_codebooks": CODEBOOKS, "audio_codebook_size": CODEBOOK_SIZE,
              "audio_stream_bos_id": CODEBOOK_SIZE, "audio_stream_eos_id": CODEBOOK_SIZE + 1,
              "audio_in_token_idx": token("<|AUDIO|>"), "audio_out_token_idx": token("<|AUDIO_OUT|>"),
              "audio_out_bos_token_id": token("<|audio_out_bos|>"), "audio_eos_token_id": token("<|audio_eos|>"),
              "pad_token_id": token("<|end_of_text|>")}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"eos_token_id": [token("<|eot_id|>"), token("<|end_of_text|>")]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


BUILDERS = {"higgs_audio": higgs_audio}
