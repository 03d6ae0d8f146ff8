"""A tiny random Chatterbox checkpoint (see converters/tiny.py) in the release layout of ResembleAI/chatterbox:

    t3_cfg.safetensors      T3: Llama backbone (tfmr.*), conditioning encoder (speaker, perceiver, emotion),
                            text / speech embeddings and learned positions, text / speech heads
    s3gen.safetensors       S3Gen's flow (token embedding, upsampling conformer, flow-matching estimator)
                            and HiFT vocoder (mel2wav.*)
    ve.safetensors          the voice encoder (3-layer LSTM over 40 mels, projection to 256)
    tokenizer.json          a character-level text tokenizer with the release's special tokens and ids
                            ([STOP] 0, [UNK] 1, [SPACE] 2, [START] 255)
    conds.pt                the built-in voice: T3Cond fields and S3Gen's reference (prompt tokens,
                            prompt mel, x-vector), random
    config.json             not in the release: the tiny sizes (see below); python_backends/tts/chatterbox*.py
                            and the reference run (tests/ref/chatterbox_ref.py) build their models from it

The package fixes its sizes in code; its classes take them as arguments (LLAMA_CONFIGS entry, Perceiver,
UpsampleConformerEncoder, ConditionalDecoder, HiFTGenerator, ConvRNNF0Predictor), so the tiny sizes are
those arguments. What had to stay real: the conformer width 512 (its pre-lookahead and upsampling layers
are built with 512 channels) and its 4 upsampled layers, 80 mel bins, the estimator's 320 input channels,
the speaker embedding sizes (256 for T3, 192 for S3Gen), the text / speech vocabularies (704 / 8194,
6561 S3 tokens), the position tables, HiFT's rates (24 kHz, 480 samples a mel frame), the voice encoder.
Weights are written by python_backends/tts/chatterbox*.py's modules, whose parameter names are the
package's. s3gen.safetensors also holds the S3 speech tokenizer (`tokenizer.*`: s3tokenizer's encoder at
ModelConfig sizes n_audio_state 128, 2 heads of 64 (the rotary width is fixed at 64), 1 layer; 128 mels,
FSQ to 6561 ids) and the CAMPPlus x-vector encoder (`speaker_encoder.*`: growth_rate 8, bn_size 2,
init_channels 32; the 80 fbank bins and the 192-d output stay), which voice cloning uses; their mel
filter and window buffers are left out, as in the release (the package computes them).
"""
from __future__ import annotations

import json
import string
from pathlib import Path

import torch

TINY_CONFIG = {
    "model_type": "chatterbox",
    "t3": {
        "llama": dict(vocab_size=8, max_position_embeddings=131072, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, head_dim=16, tie_word_embeddings=False,
                      hidden_act="silu", attention_bias=False, attention_dropout=0.0, initializer_range=0.02,
                      mlp_bias=False, model_type="llama", num_key_value_heads=4, pretraining_tp=1,
                      rms_norm_eps=1e-05,
                      rope_scaling=dict(factor=8.0, high_freq_factor=4.0, low_freq_factor=1.0,
                                        original_max_position_embeddings=8192, rope_type="llama3"),
                      rope_theta=500000.0, use_cache=True),
        "perceiver": dict(pre_attention_query_token=32, pre_attention_query_size=64, embedding_dim=64,
                          num_attn_heads=4),
    },
    "s3gen": {
        "encoder": dict(output_size=512, attention_heads=4, linear_units=64, num_blocks=1),
        "decoder": dict(channels=[32], attention_head_dim=8, n_blocks=1, num_mid_blocks=1, num_heads=2),
        "hift": dict(base_channels=32),
        "f0_predictor": dict(cond_channels=16),
        "tokenizer": dict(n_mels=128, n_audio_state=128, n_audio_head=2, n_audio_layer=1),
        "xvector": dict(growth_rate=8, bn_size=2, init_channels=32),
    },
}
PROMPT_TOKENS, PROMPT_T3_TOKENS = 20, 150


def chatterbox_tokenizer(out: Path) -> None:
    """Characters (no merges beyond a few common pairs) with the release's special-token ids."""
    from tokenizers import AddedToken, Tokenizer, models

    specials = {"[STOP]": 0, "[UNK]": 1, "[SPACE]": 2}
    vocab = dict(specials)
    for ch in string.ascii_letters + string.digits + string.punctuation:
        vocab[ch] = len(vocab)
    merges = [("t", "h"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "u")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    while len(vocab) < 255:
        vocab[f"[unused{len(vocab)}]"] = len(vocab)
    for name in ("[START]", "[PAD]", "[SEP]", "[CLS]", "[MASK]"):
        vocab[name] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="[UNK]"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in
                            ("[STOP]", "[UNK]", "[SPACE]", "[START]", "[PAD]", "[SEP]", "[CLS]", "[MASK]")])
    tok.save(str(out / "tokenizer.json"))


def voice_encoders(g: torch.Generator) -> dict[str, torch.nn.Module]:
    """The S3 tokenizer and the x-vector encoder at the tiny sizes, random; batch-norm statistics that are
    not the identity, FSQ projections large enough that every digit takes all three values."""
    from triton_omni.tts.chatterbox.voice import CAMPPlus, S3Tokenizer

    sizes = TINY_CONFIG["s3gen"]
    tokenizer, xvector = S3Tokenizer(**sizes["tokenizer"]), CAMPPlus(**sizes["xvector"])
    with torch.no_grad():
        for p in tokenizer.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        tokenizer.quantizer._codebook.project_down.weight.mul_(4.0)
        for m in xvector.modules():
            if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
                if m.affine:
                    m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=g))
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return {"tokenizer.": tokenizer, "speaker_encoder.": xvector}


def chatterbox(out: Path, seed: int = 31) -> None:
    from safetensors.torch import save_file

    from triton_omni.converters.tiny_common import randomize
    from triton_omni.tts.chatterbox.s3gen import S3Gen
    from triton_omni.tts.chatterbox.t3 import T3

    chatterbox_tokenizer(out)
    torch.manual_seed(seed)
    t3 = T3(TINY_CONFIG["t3"])
    randomize(t3, seed=seed, std=0.25)
    with torch.no_grad():
        t3.speech_head.weight.mul_(2.0)                  # confident, varied token choices
    save_file({k: v.contiguous() for k, v in t3.state_dict().items()}, str(out / "t3_cfg.safetensors"))

    s3gen = S3Gen(TINY_CONFIG["s3gen"])
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        hift = s3gen.mel2wav
        hift.f0_predictor.classifier.bias.fill_(150.0)   # an F0 around 150 Hz: voiced, the sine source sounds
        hift.f0_predictor.classifier.weight.mul_(20.0)
        for p in (hift.conv_post.parametrizations.weight.original1, *[u.parametrizations.weight.original1
                                                                      for u in hift.ups]):
            p.copy_(0.01 * torch.randn(p.shape, generator=g))    # the package's init for these
        s3gen.flow.input_embedding.weight.normal_(0, 1, generator=g)
    state = dict(s3gen.state_dict())
    for prefix, module in voice_encoders(g).items():
        state.update({prefix + k: v for k, v in module.state_dict().items()})
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "s3gen.safetensors"))

    lstm, proj = torch.nn.LSTM(40, 256, num_layers=3, batch_first=True), torch.nn.Linear(256, 256)
    ve = {f"lstm.{k}": v for k, v in lstm.state_dict().items()}
    ve.update({f"proj.{k}": v for k, v in proj.state_dict().items()})
    ve.update(similarity_weight=torch.tensor([10.0]), similarity_bias=torch.tensor([-5.0]))
    save_file({k: v.contiguous() for k, v in ve.items()}, str(out / "ve.safetensors"))

    conds = {
        "t3": {"speaker_emb": torch.randn(1, 256, generator=g), "clap_emb": None,
               "cond_prompt_speech_tokens": torch.randint(0, 6561, (1, PROMPT_T3_TOKENS), generator=g),
               "cond_prompt_speech_emb": None, "emotion_adv": 0.5 * torch.ones(1, 1, 1)},
        "gen": {"prompt_token": torch.randint(0, 6561, (1, PROMPT_TOKENS), generator=g),
                "prompt_token_len": torch.tensor([PROMPT_TOKENS]),
                "prompt_feat": torch.randn(1, 2 * PROMPT_TOKENS, 80, generator=g) - 5.0,   # log-mel-like
                "prompt_feat_len": None,
                "embedding": torch.randn(1, 192, generator=g)},
    }
    torch.save(conds, out / "conds.pt")
    (out / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2))


BUILDERS: dict = {"chatterbox": chatterbox}
