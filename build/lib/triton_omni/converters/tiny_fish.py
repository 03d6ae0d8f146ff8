"""A tiny random Fish S2-Pro folder in the release layout: config.json (`fish_qwen3_omni`: text_config,
audio_decoder_config), model.safetensors (`text_model.model.*`, `audio_decoder.*`, the release's names:
wqkv, wo, w1/w2/w3, attention_norm, ffn_norm, q_norm/k_norm), a tokenizer with the release's special
tokens and contiguous `<|semantic:i|>` tokens, and codec.pth (the modded DAC, encoder and decoder, its
weight-normalised convolutions stored as torch saves them: parametrizations.weight.original0/1 for
the encoder's and decoder's causal convs, weight_g/weight_v for the quantizers' in/out projections,
plain weights for the quantizer's down/upsampling convs, as the release's codec.pth).

No reference class writes S2-Pro (fish-speech 0.1.0 is S1-mini), so the tensors are written by name;
tests/test_tts_fish_parity.py loads them into the package's classes.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from triton_omni.converters.tiny_common import CORPUS

NUM_CODEBOOKS, CODEBOOK_SIZE = 4, 64                  # release: 10, 4096
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>", "<|phoneme_start|>", "<|phoneme_end|>",
            "<|text|>", "<|voice|>", "<|interleave|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"]
TEXT = dict(vocab_size=0, n_layer=2, n_head=4, n_local_heads=2, head_dim=16, dim=64, intermediate_size=128,
            rope_base=1000000.0, norm_eps=1e-6, max_seq_len=1024, tie_word_embeddings=True,
            attention_qkv_bias=False, attention_o_bias=False, attention_qk_norm=True)
AUDIO = dict(vocab_size=CODEBOOK_SIZE, num_codebooks=NUM_CODEBOOKS, n_layer=2, n_head=3, n_local_heads=1,
             head_dim=16, dim=48, intermediate_size=96, attention_qkv_bias=False, attention_o_bias=False,
             attention_qk_norm=False)
# codec: release latent 1024, codebook_dim 8, semantic 4096 + 9 x 1024 codes, post_module 8 layers (3072),
# upsample (2, 2), decoder 1536 channels, rates (8, 8, 4, 2): 2048 samples a frame
CODEC = dict(latent=128, codebook_dim=8, semantic_size=CODEBOOK_SIZE, residual_size=32,
             residual_codebooks=NUM_CODEBOOKS - 1, post_layers=2, post_hidden=256, upsample=(2, 2), decoder_dim=64,
             rates=(8, 8, 4, 2), encoder_dim=8, encoder_rates=(2, 4, 8, 8), encoder_layers=(0, 0, 0, 1), pre_layers=2)
# release encoder: encoder_dim 64 (x 16 = the latent width), rates (2, 4, 8, 8), a 4-layer transformer after
# the last block, pre_module 8 layers: 512 x 4 = 2048 samples a frame, as the decoder's


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    semantic = [f"<|semantic:{i}|>" for i in range(CODEBOOK_SIZE)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=640, special_tokens=SPECIALS + semantic,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                   additional_special_tokens=SPECIALS[2:] + semantic)
    fast.save_pretrained(str(out))
    return fast


def _layer(prefix: str, cfg: dict, g: torch.Generator, std: float) -> dict:
    d, hd, h, kv, ff = cfg["dim"], cfg["head_dim"], cfg["n_head"], cfg["n_local_heads"], cfg["intermediate_size"]
    r = lambda *shape: std * torch.randn(*shape, generator=g)  # noqa: E731
    n = lambda dim: 1.0 + 0.1 * torch.randn(dim, generator=g)  # noqa: E731
    out = {f"{prefix}attention.wqkv.weight": r((h + 2 * kv) * hd, d), f"{prefix}attention.wo.weight": r(d, h * hd),
           f"{prefix}feed_forward.w1.weight": r(ff, d), f"{prefix}feed_forward.w3.weight": r(ff, d),
           f"{prefix}feed_forward.w2.weight": r(d, ff), f"{prefix}attention_norm.weight": n(d),
           f"{prefix}ffn_norm.weight": n(d)}
    if cfg["attention_qk_norm"]:
        out[f"{prefix}attention.q_norm.weight"] = n(hd)
        out[f"{prefix}attention.k_norm.weight"] = n(hd)
    return out


def talker_tensors(vocab: int, seed: int = 7, std: float = 0.25) -> dict:
    g = torch.Generator().manual_seed(seed)
    t, a = {**TEXT, "vocab_size": vocab}, AUDIO
    out = {"text_model.model.embeddings.weight": std * torch.randn(vocab, t["dim"], generator=g),
           "text_model.model.norm.weight": 1.0 + 0.1 * torch.randn(t["dim"], generator=g),
           "audio_decoder.codebook_embeddings.weight": std * torch.randn(CODEBOOK_SIZE * NUM_CODEBOOKS, t["dim"],
                                                                         generator=g),
           "audio_decoder.embeddings.weight": std * torch.randn(CODEBOOK_SIZE, a["dim"], generator=g),
           "audio_decoder.norm.weight": 1.0 + 0.1 * torch.randn(a["dim"], generator=g),
           "audio_decoder.output.weight": std * torch.randn(CODEBOOK_SIZE, a["dim"], generator=g),
           "audio_decoder.project_in.weight": std * torch.randn(a["dim"], t["dim"], generator=g),
           "audio_decoder.project_in.bias": 0.1 * torch.randn(a["dim"], generator=g)}
    for i in range(t["n_layer"]):
        out.update(_layer(f"text_model.model.layers.{i}.", t, g, std))
    for i in range(a["n_layer"]):
        out.update(_layer(f"audio_decoder.layers.{i}.", a, g, std))
    return out


def _randomize(module: torch.nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(("alpha", "gamma")) or "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            else:                              # keep activations in range: ~1 / sqrt(fan-in)
                fan_in = p[0].numel() if p.ndim > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) / max(fan_in, 1) ** 0.5)


def codec_state(seed: int = 11) -> dict:
    """Our decoder's and encoder's tensors, random (the codebooks and out_proj, which both sides use,
    are the decoder's), then stored under the release's weight-norm names."""
    from triton_omni.tts.fish.codec import CodecSizes, FishCodec, FishCodecEncoder

    torch.manual_seed(seed)
    codec = FishCodec(CodecSizes(**CODEC))
    encoder = FishCodecEncoder(CodecSizes(**CODEC))
    g = torch.Generator().manual_seed(seed)
    _randomize(codec, g)
    with torch.no_grad():
        last = codec.decoder.model[-2].conv.weight          # the conv before tanh: keep the output unsaturated
        last.mul_(0.02)
    _randomize(encoder, g)
    out = {}
    for key, value in {**encoder.state_dict(), **codec.state_dict()}.items():
        wn_old = ".out_proj.weight" in key or ".in_proj.weight" in key   # dac's WNConv1d (torch's old weight_norm)
        wn_new = key.startswith(("decoder.model.", "encoder.block.")) and key.endswith("conv.weight")
        if wn_old or wn_new:
            base = key[:-len(".weight")]
            g_ = value.norm(dim=tuple(range(1, value.ndim)), keepdim=True)
            if wn_old:
                out[base + ".weight_g"], out[base + ".weight_v"] = g_, value.clone()
            else:
                out[base + ".parametrizations.weight.original0"] = g_
                out[base + ".parametrizations.weight.original1"] = value.clone()
        else:
            out[key] = value.clone()
    return out


def fish_s2(out: Path) -> None:
    from safetensors.torch import save_file

    tokenizer = build_tokenizer(out)
    vocab = tokenizer.get_vocab()
    semantic = [vocab[f"<|semantic:{i}|>"] for i in range(CODEBOOK_SIZE)]
    config = {"model_type": "fish_qwen3_omni", "text_config": {**TEXT, "vocab_size": len(tokenizer)},
              "audio_decoder_config": AUDIO, "semantic_start_token_id": min(semantic),
              "semantic_end_token_id": max(semantic)}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in talker_tensors(len(tokenizer)).items()}, str(out / "model.safetensors"))
    torch.save(codec_state(), str(out / "codec.pth"))


BUILDERS = {"fish_s2": fish_s2}
