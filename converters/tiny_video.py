"""Tiny random checkpoints for the video models (see converters/tiny.py), each a whole diffusers
pipeline folder written by the pipeline's own `save_pretrained`: Wan2.2 TI2V-5B (`WanPipeline` with
`expand_timesteps`, the high-compression VAE), T2V-A14B (`WanPipeline` with two expert transformers
and a boundary) and I2V-A14B (`WanImageToVideoPipeline`, no image encoder, two experts); Cosmos3 text-to-video
(`Cosmos3OmniPipeline`: one mixture-of-transformers model that reads the prompt's token ids itself,
over the Wan2.2 VAE).

Shapes keep what the serving code depends on: the VAEs' 4x temporal and 16x (Wan2.2) or 8x (Wan2.1)
spatial compression, 48 or 16 latent channels with per-channel mean and std, the Wan2.2 VAE's 2x2
pixel patches, the transformers' [1, 2, 2] patches and their 48 / 16 / 36 input channels, a UMT5
text encoder with a T5-style tokenizer (trailing `</s>`), and the release's UniPC flow schedules and
boundary ratios (diffusers' scripts/convert_wan_to_diffusers.py). Everything else shrinks.
"""
from __future__ import annotations

from pathlib import Path

import torch

from triton_omni.converters.tiny_common import CORPUS, qwen2_tokenizer, seeded

VIDEO_CORPUS = CORPUS + ["waves at dusk on a quiet beach, a red fox running through snow, a lighthouse",
                         "a cat walks along a wall, the camera slowly pans left, clouds drift over hills"]


def t5_tokenizer():
    """A T5-style tokenizer (what google/umt5-xxl ships: a unigram model over Metaspace pieces, `</s>`
    appended, `<pad>` id 0), with a tiny vocabulary trained on the corpus."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import T5TokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC(), normalizers.Replace("  ", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(VIDEO_CORPUS * 4, trainer)
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", eos)])
    return T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>", extra_ids=0)


def umt5_encoder(tokenizer, seed: int):
    """UMT5EncoderModel (each layer with its own relative position bias, gated-GELU feed-forward)."""
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                        relative_attention_num_buckets=8, relative_attention_max_distance=32,
                        feed_forward_proj="gated-gelu", dropout_rate=0.0, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    return seeded(seed, lambda: UMT5EncoderModel(config)).eval()


def wan_transformer(seed: int, in_channels: int, out_channels: int):
    """WanTransformer3DModel: 2 heads of 12 (the rotary table splits a head 4 / 4 / 4 over frames, rows,
    columns), 2 blocks, the text width of the tiny encoder."""
    from diffusers import WanTransformer3DModel

    model = seeded(seed, lambda: WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=in_channels,
        out_channels=out_channels, text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32))
    # The modulation table and the output projection start small: louder values make the timestep, the
    # prompt and the first frame visible in the output (and so in what the tests compare).
    g = torch.Generator().manual_seed(seed * 10)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "scale_shift_table" in name or name.startswith("proj_out"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model


def unipc(flow_shift: float):
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                   flow_shift=flow_shift)


def _stats(seed: int, n: int) -> tuple[list[float], list[float]]:
    """Per-channel latent mean and std that are not the identity, so (de)normalisation shows."""
    g = torch.Generator().manual_seed(seed)
    return (0.2 * torch.randn(n, generator=g)).tolist(), (0.5 + torch.rand(n, generator=g)).tolist()


def wan2_2_ti2v(out: Path) -> None:
    """Wan2.2 TI2V-5B: WanPipeline(expand_timesteps=True) over the Wan2.2 VAE (48 channels, 2x2 pixel
    patches, 16x spatial / 4x temporal, residual blocks); text+image requests use
    WanImageToVideoPipeline on the same folder. UniPC with flow_shift 5."""
    from diffusers import AutoencoderKLWan, WanPipeline

    tokenizer = t5_tokenizer()
    mean, std = _stats(30, 48)
    vae = seeded(31, lambda: AutoencoderKLWan(
        base_dim=4, decoder_base_dim=8, z_dim=48, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12, patch_size=2,
        scale_factor_temporal=4, scale_factor_spatial=16, latents_mean=mean, latents_std=std)).eval()
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=umt5_encoder(tokenizer, 32), vae=vae, scheduler=unipc(5.0),
                       transformer=wan_transformer(33, 48, 48), transformer_2=None, boundary_ratio=None,
                       expand_timesteps=True)
    pipe.save_pretrained(str(out))


def _wan21_vae(seed: int):
    """The Wan2.1 VAE (16 channels, 8x spatial / 4x temporal) of the A14B models."""
    from diffusers import AutoencoderKLWan

    mean, std = _stats(seed, 16)
    return seeded(seed + 1, lambda: AutoencoderKLWan(
        base_dim=4, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=mean, latents_std=std)).eval()


def wan2_2_t2v_a14b(out: Path) -> None:
    """Wan2.2 T2V-A14B: WanPipeline with a high-noise expert (`transformer`) and a low-noise one
    (`transformer_2`), switched where the timestep falls below boundary_ratio 0.875 x 1000."""
    from diffusers import WanPipeline

    tokenizer = t5_tokenizer()
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=umt5_encoder(tokenizer, 40), vae=_wan21_vae(41),
                       scheduler=unipc(3.0), transformer=wan_transformer(43, 16, 16),
                       transformer_2=wan_transformer(44, 16, 16), boundary_ratio=0.875)
    pipe.save_pretrained(str(out))


def wan2_2_i2v_a14b(out: Path) -> None:
    """Wan2.2 I2V-A14B: WanImageToVideoPipeline without an image encoder; the first frame's VAE latents
    and a 4-channel frame mask ride beside the noise (16 + 4 + 16 = 36 input channels); two experts,
    boundary_ratio 0.9."""
    from diffusers import WanImageToVideoPipeline

    tokenizer = t5_tokenizer()
    pipe = WanImageToVideoPipeline(tokenizer=tokenizer, text_encoder=umt5_encoder(tokenizer, 50), vae=_wan21_vae(51),
                                   scheduler=unipc(3.0), image_processor=None, image_encoder=None,
                                   transformer=wan_transformer(53, 36, 16), transformer_2=wan_transformer(54, 36, 16),
                                   boundary_ratio=0.9)
    pipe.save_pretrained(str(out))


def _wan22_vae(seed: int):
    """The Wan2.2 VAE (48 channels, 2x2 pixel patches, 16x spatial / 4x temporal, residual blocks)."""
    from diffusers import AutoencoderKLWan

    mean, std = _stats(seed, 48)
    return seeded(seed + 1, lambda: AutoencoderKLWan(
        base_dim=4, decoder_base_dim=8, z_dim=48, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12, patch_size=2,
        scale_factor_temporal=4, scale_factor_spatial=16, latents_mean=mean, latents_std=std)).eval()


# Cosmos3's chat turns (the release's tokenizer is Qwen's: ChatML, `<|vision_start|>` opens generation)
COSMOS3_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)
COSMOS3_SYSTEM = "You are a helpful assistant who will generate videos from a give prompt."


def cosmos3_t2v(out: Path) -> None:
    """Cosmos3 (text to video): `Cosmos3OmniPipeline` over a `Cosmos3OmniTransformer` of 2 MoT layers
    (hidden 64, 4 query heads of 16 over 2 key/value heads, 3-D mRoPE split 4/2/2, fps modulation, the
    release's 15000-position margin between text and video), the Wan2.2 VAE (48 channels, 2x2 latent
    patches: 192 values a token, as the release), a Qwen2 tokenizer with the system prompt and the
    templates' words in its corpus, UniPC flow matching. No guardrail (cosmos_guardrail is a separate
    package; the pipeline folder records enable_safety_checker false)."""
    from diffusers import Cosmos3OmniPipeline, Cosmos3OmniTransformer

    tokenizer = qwen2_tokenizer(COSMOS3_SYSTEM + " The video is not 1.0 seconds long and is of 24 FPS. "
                                "This video is of 64x32 resolution.")
    tokenizer.chat_template = COSMOS3_TEMPLATE
    transformer = seeded(62, lambda: Cosmos3OmniTransformer(
        head_dim=16, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, latent_channel=48, latent_patch_size=2, patch_latent_dim=192, rope_axes_dim=[4, 2, 2],
        vocab_size=len(tokenizer), enable_fps_modulation=True, base_fps=24))
    # louder output projection and embeddings than the default init, so the prompt and the timestep
    # show in the prediction (and so in what the tests compare)
    g = torch.Generator().manual_seed(620)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if name.startswith(("proj_out", "embed_tokens")):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    pipe = Cosmos3OmniPipeline(transformer=transformer.eval(), text_tokenizer=tokenizer, vae=_wan22_vae(60),
                               scheduler=unipc(5.0), sound_tokenizer=None, safety_checker=None,
                               enable_safety_checker=False)
    pipe.save_pretrained(str(out))


BUILDERS: dict = {"wan2_2_ti2v": wan2_2_ti2v, "wan2_2_t2v_a14b": wan2_2_t2v_a14b, "wan2_2_i2v_a14b": wan2_2_i2v_a14b,
                  "cosmos3_t2v": cosmos3_t2v}
