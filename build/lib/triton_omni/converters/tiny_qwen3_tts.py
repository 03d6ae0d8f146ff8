"""Tiny random Qwen3-TTS checkpoints in the release layout, written without the `qwen-tts` package.

    <out>/config.json              Qwen3TTSConfig keys (talker_config with code_predictor_config,
                                   speaker_encoder_config, tts_* / im_* ids, tts_model_type/size)
    <out>/generation_config.json   the release's sampling defaults
    <out>/model.safetensors        `talker.model.*`, `talker.text_projection.*`, `talker.codec_head.*`,
                                   `talker.code_predictor.*` (q/k/v, gate/up unfused: the real names)
    <out>/tokenizer.json, tokenizer_config.json, vocab.json, merges.txt
                                   a byte-level BPE with the ChatML and tts specials; "<|im_start|>
                                   assistant\\n" is 3 tokens and the closing "<|im_end|>\\n<|im_start|>
                                   assistant\\n" 5, as with the Qwen tokenizer (the prompt slices by that)
    <out>/speech_tokenizer/        config.json (qwen3_tts_tokenizer_12hz: Mimi encoder_config +
                                   decoder_config), preprocessor_config.json, model.safetensors with
                                   `decoder.*` and `encoder.*` (Mimi, the transformers 4.x names the
                                   release file uses)

The weights come from our own modules (python_backends/tts/qwen3_tts*.py) with seeded random values;
the parity test loads the same folder with the reference classes in a separate environment.
Variants: `qwen3_tts` (0.6B-like: predictor as wide as the talker, no projection, CustomVoice
speakers incl. a dialect speaker), `qwen3_tts_1b7` (1.7B-like: a narrower predictor behind
`small_to_mtp_projection`) and `qwen3_tts_base` (0.6B-like Base, for voice cloning: no preset
speakers, `speaker_encoder.*` in model.safetensors, a random (not degenerate) Mimi encoder with RVQ
projections and a short attention window). Real sizes stay where the code depends on them: 16 codebooks
of 2048, talker vocab 3072 with the control/speaker ids above 2048, 1920 samples per frame at 24 kHz.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

CODEC_IDS = {"codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154,
             "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157}
LANGUAGES = {"english": 2050, "german": 2053, "chinese": 2055, "japanese": 2058, "beijing_dialect": 2074,
             "sichuan_dialect": 2062}
SPEAKERS = {"vivian": 3065, "ryan": 3061, "eric": 2875, "dylan": 2878}
DIALECTS = {"vivian": False, "ryan": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect"}
QWEN2_PRETOKENIZE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                     r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
TTS_SPECIALS = ["<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"]
GENERATION = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
              "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
              "subtalker_top_k": 50, "max_new_tokens": 8192}

VARIANTS = {
    "0b6": dict(talker_hidden=64, predictor_hidden=64, size="0b6"),
    "1b7": dict(talker_hidden=64, predictor_hidden=48, size="1b7"),
}

DECODER_CONFIG = {"attention_bias": False, "attention_dropout": 0.0, "latent_dim": 32, "codebook_dim": 16,
                  "codebook_size": 2048, "decoder_dim": 32, "hidden_act": "silu", "hidden_size": 32,
                  "intermediate_size": 64, "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
                  "head_dim": 16, "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 2,
                  "num_quantizers": 16, "num_semantic_quantizers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000,
                  "semantic_codebook_size": 4096, "sliding_window": 8, "upsample_rates": [8, 5, 4, 3],
                  "upsampling_ratios": [2, 2], "vector_quantization_hidden_dimension": 16}
MIMI_CONFIG = {"model_type": "mimi", "sampling_rate": 24000, "frame_rate": 12.5, "audio_channels": 1,
               "hidden_size": 16, "num_filters": 4, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4],
               "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2,
               "use_causal_conv": True, "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0,
               "codebook_size": 2048, "codebook_dim": 16, "num_quantizers": 32, "use_conv_shortcut": False,
               "vector_quantization_hidden_dimension": 16, "num_semantic_quantizers": 1, "upsample_groups": 16,
               "num_hidden_layers": 1, "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
               "head_dim": 8, "hidden_act": "gelu", "max_position_embeddings": 8000, "norm_eps": 1e-5,
               "rope_theta": 10000.0, "sliding_window": 250, "layer_scale_initial_scale": 0.01,
               "attention_bias": False}
# the Base variant's encoder: RVQ in-/output projections (the release has them: 512 -> 256) and a sliding
# window shorter than the test clips (the reference encoder ignores it: see qwen3_tts/clone.SpeechEncoder)
BASE_MIMI_CONFIG = {**MIMI_CONFIG, "codebook_dim": 8, "vector_quantization_hidden_dimension": 8, "sliding_window": 16}
PREPROCESSOR = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
                "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
                "sampling_rate": 24000}


# --- tokenizer --------------------------------------------------------------------------------------
def build_tokenizer(out: Path) -> dict[str, int]:
    """Writes the tokenizer files; returns the special tokens' ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from triton_omni.converters.tiny_common import CORPUS

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + TTS_SPECIALS
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()                   # Qwen2's pipeline, as both transformers 4 and 5 build it
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    chat = ["<|im_start|>assistant\nHello there.<|im_end|>\n<|im_start|>assistant\n",
            "<|im_start|>user\nSpeak slowly and warmly.<|im_end|>\n"] * 8
    tok.train_from_iterator(CORPUS * 4 + chat, trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.save(str(out / "tokenizer.json"))
    model = json.loads(tok.to_str())["model"]
    (out / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    ids = {s: tok.token_to_id(s) for s in specials}
    config = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768, "clean_up_tokenization_spaces": False,
              "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
              "errors": "replace", "split_special_tokens": False,
              "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                                "single_word": False, "special": True} for s, i in ids.items()}}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    role = tok.encode("<|im_start|>assistant\n").ids
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n").ids
    if len(role) != 3 or len(tail) != 5:
        raise RuntimeError(f"tiny tokenizer: role {role} / tail {tail} do not have the Qwen token counts 3 / 5")
    ids["vocab_size"] = tok.get_vocab_size()
    return ids


# --- configs ----------------------------------------------------------------------------------------
def model_config(ids: dict[str, int], variant: str) -> dict:
    v = VARIANTS[variant]
    predictor = {"vocab_size": 2048, "hidden_size": v["predictor_hidden"], "intermediate_size": 96,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                 "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
                 "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "num_code_groups": 16,
                 "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
                 "layer_types": ["full_attention"] * 2, "tie_word_embeddings": False, "use_cache": True,
                 "initializer_range": 0.02, "model_type": "qwen3_tts_talker_code_predictor"}
    talker = {"vocab_size": 3072, "hidden_size": v["talker_hidden"], "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
              "rope_scaling": {"interleaved": True, "mrope_section": [2, 3, 3], "rope_type": "default", "type": "default"},
              "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None,
              "num_code_groups": 16, "text_hidden_size": 32, "text_vocab_size": ids["vocab_size"],
              "position_id_per_seconds": 13, "initializer_range": 0.02, "use_cache": True,
              "code_predictor_config": predictor, **CODEC_IDS, "codec_language_id": LANGUAGES,
              "spk_id": SPEAKERS, "spk_is_dialect": DIALECTS, "model_type": "qwen3_tts_talker"}
    return {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
            "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": v["size"], "tts_model_type": "custom_voice",
            "im_start_token_id": ids["<|im_start|>"], "im_end_token_id": ids["<|im_end|>"],
            "tts_pad_token_id": ids["<tts_pad>"], "tts_bos_token_id": ids["<tts_text_bos>"],
            "tts_eos_token_id": ids["<tts_text_eod>"], "assistant_token_id": None, "torch_dtype": "float32",
            "speaker_encoder_config": {"mel_dim": 128, "enc_dim": v["talker_hidden"], "enc_channels": [32, 32, 32, 32, 96],
                                       "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
                                       "enc_attention_channels": 16, "enc_res2net_scale": 4, "enc_se_channels": 16,
                                       "sample_rate": 24000},
            "talker_config": talker}


def codec_config(encoder: dict = MIMI_CONFIG) -> dict:
    return {"architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
            "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
            "decode_upsample_rate": 1920, "encode_downsample_rate": 1920, "torch_dtype": "float32",
            "encoder_config": encoder, "decoder_config": DECODER_CONFIG}


# --- weights ----------------------------------------------------------------------------------------
def checkpoint_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Our parameters under the checkpoint's names: fused projections split back into q/k/v, gate/up."""
    from triton_omni.models.decoder import PACKED

    merged = {}
    for frag, (name, index) in PACKED.items():
        merged.setdefault(name, {})[index] = frag
    out = {}
    for name, p in model.named_parameters():
        module, leaf = name.rsplit(".", 1)
        owner = model.get_submodule(module)
        parts = merged.get(module.rsplit(".", 1)[-1])
        if parts and hasattr(owner, "out_sizes"):
            for i, piece in enumerate(p.detach().split(owner.out_sizes, dim=0)):
                out[f"{module.rsplit('.', 1)[0]}.{parts[i]}.{leaf}"] = piece.clone().contiguous()
        else:
            out[name] = p.detach().clone().contiguous()
    return out


def _randomize(model: torch.nn.Module, seed: int, std: float = 0.25) -> None:
    """Seeded values: norms near 1, the rest large enough that every layer visibly matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * r)
            elif name.endswith("embedding.weight") or ".codec_embedding." in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(std * r)


def _randomize_codec(model: torch.nn.Module, seed: int) -> None:
    """Fan-in scaled weights (the waveform stays mostly inside the final clamp), per-kind values elsewhere."""
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            module, leaf = name.rsplit(".", 1)
            owner = model.get_submodule(module)
            if leaf == "cluster_usage":
                p.copy_(0.5 + 1.5 * torch.rand(p.shape, generator=g))
            elif leaf == "embedding_sum":
                p.copy_(r)
            elif leaf in ("alpha", "beta"):
                p.copy_(0.2 * r)
            elif leaf in ("scale", "gamma"):
                p.copy_(0.3 + 0.1 * r)
            elif "norm" in name and leaf == "weight":
                p.copy_(1.0 + 0.1 * r)
            elif leaf == "bias":
                p.copy_(0.05 * r)
            elif isinstance(owner, nn.ConvTranspose1d):          # [in, out, k]: k / stride inputs per output
                p.copy_(r / (p.shape[0] * owner.kernel_size[0] / owner.stride[0]) ** 0.5)
            else:                                                # linear / conv: [out, in (/ groups), k]
                p.copy_(r / p[0].numel() ** 0.5 * (0.2 if name.endswith("conv2.conv.weight") else 1.0))
        # the last conv scaled so the waveform sits inside the final clamp (std ~0.25, no offset)
        codes = torch.randint(0, model.decoder.config["codebook_size"], (2, model.num_quantizers, 24), generator=g)
        last = model.decoder.decoder[-1].conv
        last.bias.zero_()
        seen = []
        hook = last.register_forward_hook(lambda m, i, o: seen.append(o))     # before the clamp
        model.decoder(codes)
        hook.remove()
        scale = 0.25 / seen[0].std().clamp(min=1e-6)
        last.weight.mul_(scale)
        last.bias.fill_(-float(seen[0].mean() * scale))


def _randomize_mimi(state: dict[str, torch.Tensor], seed: int) -> None:
    """Values that make the encoder's codes depend on the audio (MimiModel's init has all-zero
    codebooks: every code 0): fan-in scaled weights, random codebooks and usages, layer scales ~0.3."""
    g = torch.Generator().manual_seed(seed)
    for name, t in state.items():
        r = torch.randn(t.shape, generator=g)
        if name.endswith("initialized"):
            continue
        if name.endswith("cluster_usage"):
            t.copy_(0.5 + 1.5 * torch.rand(t.shape, generator=g))
        elif name.endswith("embed_sum"):
            t.copy_(r)
        elif name.endswith("_scale.scale"):
            t.copy_(0.3 + 0.1 * r)
        elif "norm" in name:
            t.copy_(1.0 + 0.1 * r if name.endswith("weight") else 0.05 * r)
        elif name.endswith("bias"):
            t.copy_(0.05 * r)
        else:
            t.copy_(r / (t[0].numel() ** 0.5))


def mimi_encoder_state(seed: int, encoder: dict = MIMI_CONFIG, randomize: bool = False) -> dict[str, torch.Tensor]:
    """The speech tokenizer's `encoder.*` (a Mimi model without its decoder) with transformers 4.x
    names, built from this environment's transformers `MimiModel`."""
    from transformers import MimiConfig, MimiModel

    torch.manual_seed(seed)
    config = MimiConfig(**{k: v for k, v in encoder.items() if k != "model_type"})
    state = MimiModel(config).state_dict()
    if randomize:
        _randomize_mimi(state, seed)
    renames = (("encoder.encoder_seanet.", "encoder."), ("encoder.downsample.", "downsample."),
               ("encoder.encoder_transformer.", "encoder_transformer."))
    out = {}
    for name, t in state.items():
        if name.startswith(("upsample.", "decoder_transformer.", "decoder.")):
            continue
        for old, new in renames:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        out["encoder." + name] = t.clone().contiguous()
    return out


def speech_tokenizer(out: Path, seed: int = 1212, encoder: dict = MIMI_CONFIG, random_encoder: bool = False) -> None:
    from safetensors.torch import save_file

    from triton_omni.tts.qwen3_tts.codec import Qwen3TTSCodec

    out.mkdir(parents=True, exist_ok=True)
    config = codec_config(encoder)
    codec = Qwen3TTSCodec(config)
    _randomize_codec(codec, seed)
    state = checkpoint_state(codec)
    g = torch.Generator().manual_seed(seed + 1)
    c = DECODER_CONFIG
    for part in ("rvq_first", "rvq_rest"):               # the encode-side projections the release file has
        state[f"decoder.quantizer.{part}.input_proj.weight"] = torch.randn(
            c["codebook_dim"] // 2, c["codebook_dim"], 1, generator=g) / c["codebook_dim"] ** 0.5
    state.update(mimi_encoder_state(seed + 2, encoder, random_encoder))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))


def speaker_encoder_state(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """`speaker_encoder.*`: fan-in scaled convs (x2 variance for the ReLUs), the last one scaled so a
    voiced test signal's x-vector has std 0.5, like the codec embeddings it stands in for."""
    from triton_omni.tts.qwen3_tts.clone import SpeakerEncoder, mel_spectrogram

    enc = SpeakerEncoder(config["speaker_encoder_config"])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in enc.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(0.05 * r if name.endswith("bias") else r * (2.0 / p[0].numel()) ** 0.5)
        t = torch.arange(24000) / 24000
        wave = 0.3 * torch.sin(2 * torch.pi * (150 + 200 * t) * t) + 0.02 * torch.randn(24000, generator=g)
        x = enc(mel_spectrogram(wave[None]))
        enc.fc.weight.mul_(0.5 / x.std())
        enc.fc.bias.zero_()
    return {f"speaker_encoder.{k}": v.clone().contiguous() for k, v in enc.state_dict().items()}


def qwen3_tts(out: Path, variant: str = "0b6", seed: int = 31, base: bool = False) -> None:
    from safetensors.torch import save_file

    from triton_omni.tts.qwen3_tts.model import Qwen3TTS, Qwen3TTSConfig

    ids = build_tokenizer(out)
    config = model_config(ids, variant)
    if base:                    # voice cloning instead of preset speakers
        config["tts_model_type"] = "base"
        config["talker_config"].update(spk_id={}, spk_is_dialect={})
    model = Qwen3TTS(Qwen3TTSConfig.from_dict(config))
    _randomize(model, seed)
    state = checkpoint_state(model)
    if base:
        state.update(speaker_encoder_state(config, seed + 1))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(GENERATION, indent=2))
    speech_tokenizer(out / "speech_tokenizer", encoder=BASE_MIMI_CONFIG if base else MIMI_CONFIG, random_encoder=base)


BUILDERS: dict = {"qwen3_tts": qwen3_tts, "qwen3_tts_1b7": lambda out: qwen3_tts(out, "1b7", seed=37),
                  "qwen3_tts_base": lambda out: qwen3_tts(out, seed=41, base=True)}
