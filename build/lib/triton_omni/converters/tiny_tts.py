"""Tiny random checkpoints for the speech models (see converters/tiny.py), in the release layouts.

orpheus      a Llama-3 talker as canopylabs ships it: `LlamaForCausalLM` (save_pretrained: config.json,
             model.safetensors, llama3 rope scaling), a byte-level BPE tokenizer with Llama-3's
             special tokens and the `<custom_token_N>` tokens right after the text vocabulary
             (10 control tokens + 7 x 4096 audio tokens + 2, as the release's 128256 + 28684).
snac_24khz   hubertsiuzdak/snac_24khz's layout: config.json (24 kHz rates and strides, tiny widths) and
             pytorch_model.bin written from `snac.SNAC` with the old `weight_g`/`weight_v` names that
             the release file has.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

AUDIO_CUSTOM_TOKENS = 10 + 7 * 4096 + 2
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]

SNAC_TINY_CONFIG = {"sampling_rate": 24000, "encoder_dim": 4, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 64,
                    "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096,
                    "codebook_dim": 8, "vq_strides": [4, 2, 1], "noise": True, "depthwise": True}


def orpheus_tokenizer(out: Path):
    """Byte-level BPE (512 pieces, Llama-3 specials, BOS added like Llama-3) + the custom tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from triton_omni.converters.tiny_common import CORPUS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=LLAMA3_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4 + ["tara: leah: jess: leo: dan: mia: zac: zoe:"] * 4, trainer)
    tok.add_special_tokens([AddedToken(f"<custom_token_{i}>", special=True, normalized=False)
                            for i in range(AUDIO_CUSTOM_TOKENS)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<|end_of_text|>")
    fast.save_pretrained(str(out))
    return fast


def orpheus(out: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from triton_omni.converters.tiny_common import randomize

    tokenizer = orpheus_tokenizer(out)
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         tie_word_embeddings=True, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 1024},
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=eot, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    randomize(model, seed=7, std=0.25)
    model.save_pretrained(str(out))
    end_of_speech = tokenizer.convert_tokens_to_ids("<custom_token_2>")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot, end_of_speech]}, indent=2))


def snac_state_dict_release_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """torch's parametrized weight norm names -> the old names the released file uses."""
    return {k.replace(".parametrizations.weight.original0", ".weight_g")
             .replace(".parametrizations.weight.original1", ".weight_v"): v for k, v in state.items()}


def snac_24khz(out: Path, config: dict | None = None, seed: int = 24) -> None:
    from snac import SNAC

    config = dict(config or SNAC_TINY_CONFIG)
    torch.manual_seed(seed)
    model = SNAC(**config).eval()
    with torch.no_grad():                 # louder than the init: the tiny decoder's tanh output is audible
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.uniform_(0.5, 1.5)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    torch.save(snac_state_dict_release_names(model.state_dict()), out / "pytorch_model.bin")


# Kokoro-82M v1.0's phoneme vocabulary (its config.json), so that ids and the offline G2P are real.
KOKORO_VOCAB = dict(zip(
    ';:,.!?—…"()“” \u0303ʣʥʦʨᵝꭧAIOQSTWYᵊabcdefhijklmnopqrstuvwxyzɑɐɒæβɔɕçɖðʤəɚɛɜɟɡɥɨɪʝɯɰŋɳɲɴ'
    'øɸθœɹɾɻʁɽʂʃʈʧʊʋʌɣɤχʎʒʔˈˌːʰʲ↓→↗↘ᵻ',
    [1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 31, 33, 35, 36, 39, 41, 42,
     43, 44, 45, 46, 47, 48, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71,
     72, 75, 76, 77, 78, 80, 81, 82, 83, 85, 86, 87, 90, 92, 99, 101, 102, 103, 110, 111, 112, 113, 114, 115, 116,
     118, 119, 120, 123, 125, 126, 128, 129, 130, 131, 132, 133, 135, 136, 138, 139, 140, 142, 143, 147, 148, 156,
     157, 158, 162, 164, 169, 171, 172, 173, 177]))
# The release's config.json with small widths where the code lets them shrink: hidden_dim 512, style_dim
# 128 and the decoder's 1024/512 channels are hard-coded in the release code, so they stay; PL-BERT,
# the layer count and the vocoder's residual kernels shrink. max_dur 4 keeps random durations short
# (1-4 frames of 25 ms per phoneme); the vocoder keeps the real rates (600 samples per frame).
KOKORO_TINY_CONFIG = {
    "istftnet": {"upsample_kernel_sizes": [20, 12], "upsample_rates": [10, 6], "gen_istft_hop_size": 5,
                 "gen_istft_n_fft": 20, "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
                 "resblock_kernel_sizes": [3, 7], "upsample_initial_channel": 512},
    "dim_in": 64, "dropout": 0.2, "hidden_dim": 512, "max_conv_dim": 512, "max_dur": 4, "multispeaker": True,
    "n_layer": 1, "n_mels": 80, "n_token": 178, "style_dim": 128, "text_encoder_kernel_size": 5,
    "plbert": {"hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 512,
               "num_hidden_layers": 2, "dropout": 0.1},
    "vocab": KOKORO_VOCAB,
}
KOKORO_VOICES = ("af_heart", "am_adam", "bf_emma", "ff_siwis")    # a: US English, b: British, f: French


def kokoro(out: Path, config: dict | None = None, seed: int = 82) -> None:
    """hexgrad/Kokoro-82M's layout: config.json, kokoro-v1_0.pth (five state dicts, `module.` keys,
    weight norm as weight_g/weight_v), voices/<name>.pt ([510, 1, 256] each)."""
    from triton_omni.tts.kokoro.model import WEIGHTS_FILE, Kokoro, release_state_dicts

    config = dict(config or KOKORO_TINY_CONFIG)
    torch.manual_seed(seed)
    model = Kokoro(config).eval()
    with torch.no_grad():
        # random weights say nothing, but make them exercise the real paths: durations that vary
        # (rather than max_dur / 2 everywhere) and an F0 mostly in the voiced range (> 10 Hz) with
        # some unvoiced frames, so both the sine and the noise source are heard
        model.predictor.duration_proj["linear_layer"].weight.mul_(40.0)
        model.predictor.F0_proj.weight.mul_(200.0)
        model.predictor.F0_proj.bias.fill_(50.0)
        # log-magnitudes down: the random audio then sits inside [-1, 1] instead of clipping
        post = model.decoder.generator.conv_post.bias
        post[:post.shape[0] // 2].sub_(1.5)
    (out / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    torch.save(release_state_dicts(model), out / WEIGHTS_FILE)
    (out / "voices").mkdir()
    g = torch.Generator().manual_seed(seed)
    for name in KOKORO_VOICES:
        torch.save(0.3 * torch.randn(510, 1, 256, generator=g), out / "voices" / f"{name}.pt")


BUILDERS: dict = {"orpheus": orpheus, "snac_24khz": snac_24khz, "kokoro": kokoro}     # name -> builder(out: Path)
