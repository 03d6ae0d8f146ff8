"""Tiny random checkpoints for the image models (see converters/tiny.py).

Each folder is a whole diffusers pipeline written by the pipeline's own `save_pretrained`
(model_index.json + one subfolder per component), so it has the layout, class names and config
keys of the real download: Z-Image-Turbo (`ZImagePipeline`), FLUX.2-klein (`Flux2KleinPipeline`) and
Qwen-Image-Edit (`QwenImageEditPipeline`).
Shapes keep what the serving code depends on (an 8x VAE with 2x2 patches, so sizes snap to 16 px;
the real schedulers; the text encoders' hidden-state layers) and shrink everything else.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from triton_omni.converters.tiny_common import build_tokenizer, qwen2_tokenizer, randomize, seeded


def _tiny_vae_blocks() -> dict:
    # Four blocks, as in the real VAEs: 8x downsampling (block count sets `vae_scale_factor`).
    return dict(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=8)


def _qwen3_config(tokenizer, num_layers: int):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)


def _tokenizer():
    """The project's tiny byte-level BPE (Qwen special tokens, ChatML template); the pipeline saves it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return build_tokenizer(Path(tmp))


def z_image_turbo(out: Path) -> None:
    """ZImagePipeline: Qwen3Model text encoder (second-to-last hidden state), ZImageTransformer2DModel,
    the FLUX.1 AutoencoderKL (16 latent channels, scale and shift), a shifted flow-match schedule."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Model

    tokenizer = _tokenizer()
    text_encoder = randomize(Qwen3Model(_qwen3_config(tokenizer, num_layers=3)), seed=1)
    transformer = seeded(2, lambda: ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=64, n_layers=2, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=32, rope_theta=256.0, t_scale=1000.0,
        axes_dims=[8, 12, 12], axes_lens=[1024, 256, 256]))
    # The pad tokens fill each sequence up to a multiple of 32 and are attended to, so they shape the
    # output; set them (seeded) rather than trust whatever the constructor leaves there.
    g = torch.Generator().manual_seed(20)
    with torch.no_grad():
        transformer.x_pad_token.copy_(torch.randn(transformer.x_pad_token.shape, generator=g))
        transformer.cap_pad_token.copy_(torch.randn(transformer.cap_pad_token.shape, generator=g))
    vae = seeded(3, lambda: AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16, scaling_factor=0.3611,
                                          shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
                                          **_tiny_vae_blocks()))
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    pipe = ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                          transformer=transformer)
    pipe.save_pretrained(str(out))


def flux2_klein(out: Path) -> None:
    """Flux2KleinPipeline: Qwen3ForCausalLM text encoder (hidden states 9, 18, 27 stacked), the
    Flux2 MMDiT, AutoencoderKLFlux2 (2x2 patches, batch-norm latent statistics), a dynamically
    shifted flow-match schedule. Built as the undistilled "base" variant, so classifier-free
    guidance is exercised; a distilled checkpoint says `is_distilled: true` in model_index.json."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import Qwen3ForCausalLM

    tokenizer = _tokenizer()
    # 28 layers: the pipeline reads hidden states 9, 18 and 27, as from the real 36-layer encoder.
    text_encoder = randomize(Qwen3ForCausalLM(_qwen3_config(tokenizer, num_layers=28)), seed=4)
    latent_channels = 8
    transformer = seeded(5, lambda: Flux2Transformer2DModel(
        patch_size=1, in_channels=4 * latent_channels, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=3 * 32, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 4, 4), rope_theta=2000, guidance_embeds=False))
    # Default init leaves attention nearly uniform over the 512 text positions, so the prompt barely
    # reaches the image; sharper query/key norms and louder values let it be seen in the pixels.
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if ".norm_" in name:
                p.mul_(4.0)
            elif any(k in name for k in ("to_v.", "add_v_proj", "to_out", "to_add_out")):
                p.mul_(2.0)
    vae = seeded(6, lambda: AutoencoderKLFlux2(in_channels=3, out_channels=3, latent_channels=latent_channels,
                                               patch_size=(2, 2), **_tiny_vae_blocks()))
    # Latent statistics that are not the identity, so (de)normalisation is visible in the output.
    g = torch.Generator().manual_seed(60)
    with torch.no_grad():
        vae.bn.running_mean.copy_(0.1 * torch.randn(vae.bn.running_mean.shape, generator=g))
        vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.running_var.shape, generator=g))
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                                base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                max_image_seq_len=4096, time_shift_type="exponential")
    pipe = Flux2KleinPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                              transformer=transformer, is_distilled=False)
    pipe.save_pretrained(str(out))


def qwen_image_edit(out: Path) -> None:
    """QwenImageEditPipeline: Qwen2.5-VL text encoder (with a vision tower: the input image is part of
    the prompt), QwenImageTransformer2DModel (MMDiT; the input image's latents ride beside the noise),
    AutoencoderKLQwenImage (a causal video VAE, 16 channels, per-channel latent mean and std), and the
    release's shifted flow-match schedule. processor/ holds what `Qwen2VLProcessor` reads (image
    processor config + tokenizer); it is written by hand because transformers cannot save (or load) a
    Qwen2VLProcessor without its video processor, which needs torchvision. The tiny tokenizer splits the
    system prompt into more pieces than the release's 64, so the pipelines' fixed drop of the first 64
    tokens leaves the prompt's tail in the embeddings here; the pipeline and our steps drop the same."""
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline,
                           QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = qwen2_tokenizer()
    token = tokenizer.convert_tokens_to_ids
    hidden = 32
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
                         bos_token_id=token("<|endoftext|>"), eos_token_id=token("<|im_end|>"),
                         pad_token_id=token("<|endoftext|>")),
        # The release's patch 14, 2x2 merge, 2-frame patches and windowed + full attention blocks.
        vision_config=dict(depth=2, hidden_size=hidden, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                           fullatt_block_indexes=[1], in_channels=3),
        image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"))
    text_encoder = randomize(Qwen2_5_VLForConditionalGeneration(config), seed=7, std=0.1)
    # 16 latent channels as released (in_channels = 16 x the 2x2 patch); axes_dims_rope sums to the head dim.
    transformer = seeded(8, lambda: QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=hidden, axes_dims_rope=(4, 6, 6)))
    # Three temporal downsamplings as released: vae_scale_factor 8. Default latents_mean/std are the release's.
    vae = seeded(9, lambda: AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1))
    scheduler = FlowMatchEulerDiscreteScheduler(   # scheduler_config.json of Qwen/Qwen-Image-Edit
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
        base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential",
        invert_sigmas=False, stochastic_sampling=False, use_karras_sigmas=False, use_exponential_sigmas=False,
        use_beta_sigmas=False)
    pipe = QwenImageEditPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                 processor=None, transformer=transformer)
    pipe.save_pretrained(str(out))
    # The release's image processor settings, except max_pixels: a few hundred patches keep the vision
    # tower quick on a CPU (the release allows 12845056 pixels).
    image_processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14,
                                               temporal_patch_size=2, merge_size=2)
    image_processor.save_pretrained(str(out / "processor"))
    tokenizer.save_pretrained(str(out / "processor"))
    index = json.loads((out / "model_index.json").read_text())
    (out / "model_index.json").write_text(json.dumps({**index, "processor": ["transformers", "Qwen2VLProcessor"]},
                                                     indent=2) + "\n")


BUILDERS: dict = {"z_image_turbo": z_image_turbo, "flux2_klein": flux2_klein, "qwen_image_edit": qwen_image_edit}
