"""The speech benchmarks' workload and checkpoints: the text (and Kokoro's phonemes) every mode speaks,
and the release layouts of Orpheus (+ SNAC), Kokoro and Qwen3-TTS at their real shapes (or the tiny
test shapes) with random weights, written once under a work folder and loaded by every mode."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from perf_analyzer_configs.benchmarks.common import release_memory
from triton_omni.converters.tiny_tts import KOKORO_TINY_CONFIG, KOKORO_VOCAB, SNAC_TINY_CONFIG, snac_24khz

TEXT = ("The quick brown fox jumps over the lazy dog near the river, while seven small birds sing "
        "their morning songs in the old oak tree.")
# TEXT through python_backends/tts/kokoro/text.Phonemizer (espeak-ng 1.51, voice af_heart: en-us)
PHONEMES = ("ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ nˌɪɹ ðə ɹˈɪvəɹ, wˌIl sˈɛvən smˈɔl bˈɜɹdz "
            "sˈɪŋ ðɛɹ mˈɔɹnɪŋ sˈɔŋz ɪnðɪ ˈOld ˈOk tɹˈi.")
AUDIO_CUSTOM = 10 + 7 * 4096 + 2            # Orpheus' <custom_token_N> after the text vocabulary
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SHAPES = {"real": {
    # canopylabs/orpheus-3b-0.1-ft config.json (Llama-3.2-3B-Instruct + 28684 audio/control tokens)
    "orpheus": dict(text_vocab=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                    num_attention_heads=24, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                    rms_norm_eps=1e-5, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE),
    # hubertsiuzdak/snac_24khz config.json (19.8M parameters)
    "snac": {"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
             "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096, "codebook_dim": 8,
             "vq_strides": [4, 2, 1], "noise": True, "depthwise": True},
    # hexgrad/Kokoro-82M config.json (82M parameters; converters/tiny_tts.py shrinks PL-BERT, n_layer,
    # the resblocks and max_dur)
    "kokoro": {"istftnet": {"upsample_kernel_sizes": [20, 12], "upsample_rates": [10, 6], "gen_istft_hop_size": 5,
                            "gen_istft_n_fft": 20, "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
                            "resblock_kernel_sizes": [3, 7, 11], "upsample_initial_channel": 512},
               "dim_in": 64, "dropout": 0.2, "hidden_dim": 512, "max_conv_dim": 512, "max_dur": 50,
               "multispeaker": True, "n_layer": 3, "n_mels": 80, "n_token": 178, "style_dim": 128,
               "text_encoder_kernel_size": 5, "vocab": KOKORO_VOCAB,
               "plbert": {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 2048,
                          "max_position_embeddings": 512, "num_hidden_layers": 12, "dropout": 0.1}},
}, "tiny": {
    "orpheus": dict(text_vocab=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-5,
                    tie_word_embeddings=True,
                    rope_parameters={**LLAMA3_ROPE, "original_max_position_embeddings": 1024}),
    "snac": SNAC_TINY_CONFIG, "kokoro": KOKORO_TINY_CONFIG}}
# Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice config.json (talker, code predictor) and Qwen3-TTS-Tokenizer-12Hz's
# decoder_config; everything else (token ids, speakers, rope sections) as converters/tiny_qwen3_tts.py writes it
QWEN3_TTS_REAL = {
    "talker": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=128, text_hidden_size=2048, text_vocab_size=151936,
                   rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default",
                                 "type": "default"}),
    "predictor": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, layer_types=["full_attention"] * 5),
    "decoder": dict(codebook_dim=512, hidden_size=512, head_dim=64, latent_dim=1024, num_attention_heads=16,
                    num_key_value_heads=16, sliding_window=72, intermediate_size=1024, num_hidden_layers=8,
                    decoder_dim=1536, vector_quantization_hidden_dimension=512),
}
KOKORO_DURATION_BIAS = -2.94   # 50 sigmoids ~0.06: 3 frames (75 ms) a symbol, 9.9 s for TEXT (~150 words/min)


# --- checkpoints: the release layouts, real shapes, random weights --------------------------------
def orpheus_tokenizer(folder: Path, text_vocab: int):
    """Byte-level ids 0-255, Llama-3's specials where the release has them (128000, 128001, 128009
    for the real vocabulary), fillers up to `text_vocab`, then the <custom_token_N> tokens. One token
    per byte: TEXT's prompt is 141 tokens (Llama-3's BPE: ~35), a few ms more prefill in every mode."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from triton_omni.converters.tiny_common import byte_alphabet_index

    base = text_vocab - 256
    specials = {"<|begin_of_text|>": base, "<|end_of_text|>": base + 1, "<|eot_id|>": base + 9}
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet(), key=byte_alphabet_index))}
    vocab.update({**specials, **{f"t{i:x}": i for i in range(256, text_vocab) if i not in specials.values()}})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tok.add_special_tokens([AddedToken(f"<custom_token_{i}>", special=True, normalized=False)
                            for i in range(AUDIO_CUSTOM)])
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", base)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<|end_of_text|>")
    assert len(fast) == text_vocab + AUDIO_CUSTOM, len(fast)
    fast.save_pretrained(str(folder))
    return fast


def write_orpheus(root: Path, shapes: str, device: str, dtype) -> tuple[Path, Path]:
    """canopylabs' layout (LlamaForCausalLM save_pretrained + tokenizer) and hubertsiuzdak/snac_24khz's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder, codec = root / f"{shapes}-orpheus", root / f"{shapes}-snac_24khz"
    if not (codec / "pytorch_model.bin").exists():
        codec.mkdir(parents=True, exist_ok=True)
        snac_24khz(codec, SHAPES[shapes]["snac"], seed=24)
    if (folder / "generation_config.json").exists():          # written last
        return folder, codec
    shape = dict(SHAPES[shapes]["orpheus"])
    tok = orpheus_tokenizer(folder, shape.pop("text_vocab"))
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=eot,
                         pad_token_id=tok.pad_token_id, **shape)
    torch.manual_seed(0)
    with torch.device(device):
        LlamaForCausalLM(config).to(dtype).save_pretrained(str(folder))
    release_memory()
    end_of_speech = tok.convert_tokens_to_ids("<custom_token_2>")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot, end_of_speech]}))
    return folder, codec


def write_kokoro(root: Path, shapes: str) -> Path:
    """hexgrad/Kokoro-82M's layout (config.json, kokoro-v1_0.pth, voices/af_heart.pt)."""
    from triton_omni.tts.kokoro.model import WEIGHTS_FILE, Kokoro, release_state_dicts

    folder = root / f"{shapes}-kokoro"
    if (folder / WEIGHTS_FILE).exists():
        return folder
    config = SHAPES[shapes]["kokoro"]
    torch.manual_seed(82)
    model = Kokoro(config).eval()
    with torch.no_grad():
        dur = model.predictor.duration_proj["linear_layer"]
        dur.weight.mul_(0.5)
        dur.bias.fill_(KOKORO_DURATION_BIAS)
        model.predictor.F0_proj.bias.fill_(150.0)          # voiced, as speech mostly is
    (folder / "voices").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    torch.save(0.3 * torch.randn(510, 1, 256, generator=torch.Generator().manual_seed(82)),
               folder / "voices" / "af_heart.pt")
    torch.save(release_state_dicts(model), folder / WEIGHTS_FILE)
    return folder


def write_qwen3_tts(root: Path, shapes: str, device: str, dtype) -> Path:
    """The release layout (config.json, model.safetensors, tokenizer files, speech_tokenizer/) at the
    real sizes (or the tiny test checkpoint's). The tokenizer is the tiny byte-level one: its ids are a
    subset of the 151936-row text embedding, and speed does not depend on which ids a text uses."""
    from safetensors.torch import save_file

    from triton_omni.converters import tiny_qwen3_tts as tq
    from triton_omni.tts.qwen3_tts.model import Qwen3TTS, Qwen3TTSConfig
    from triton_omni.tts.qwen3_tts.codec import Qwen3TTSCodec

    folder = root / f"{shapes}-qwen3_tts"
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    if shapes == "tiny":
        tq.qwen3_tts(folder)
        done.touch()
        return folder
    ids = tq.build_tokenizer(folder)
    config = tq.model_config(ids, "0b6")
    config["torch_dtype"] = "bfloat16"
    config["talker_config"].update(QWEN3_TTS_REAL["talker"])
    config["talker_config"]["code_predictor_config"].update(QWEN3_TTS_REAL["predictor"])
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3TTS(Qwen3TTSConfig.from_dict(config))
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:                     # norms keep their ones
                    p.normal_(0.0, 0.02)
    save_file(tq.checkpoint_state(model.to(dtype)), str(folder / "model.safetensors"), metadata={"format": "pt"})
    del model
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(tq.GENERATION, indent=2))
    # the speech tokenizer: the real decoder (float32, as released), the tiny Mimi encoder (never used here)
    speech = folder / "speech_tokenizer"
    speech.mkdir(exist_ok=True)
    codec_config = tq.codec_config()
    codec_config["decoder_config"] = {**tq.DECODER_CONFIG, **QWEN3_TTS_REAL["decoder"]}
    codec = Qwen3TTSCodec(codec_config)
    tq._randomize_codec(codec, 1212)
    state = tq.checkpoint_state(codec)
    g = torch.Generator().manual_seed(1213)
    dim = codec_config["decoder_config"]["codebook_dim"]
    for part in ("rvq_first", "rvq_rest"):
        state[f"decoder.quantizer.{part}.input_proj.weight"] = torch.randn(dim // 2, dim, 1, generator=g) / dim ** 0.5
    state.update(tq.mimi_encoder_state(1214))
    save_file(state, str(speech / "model.safetensors"), metadata={"format": "pt"})
    (speech / "config.json").write_text(json.dumps(codec_config, indent=2))
    (speech / "preprocessor_config.json").write_text(json.dumps(tq.PREPROCESSOR, indent=2))
    release_memory()
    done.touch()
    return folder
