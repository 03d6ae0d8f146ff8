"""A tiny random JoyAI-Image-Edit checkpoint (see converters/tiny.py), in the diffusers layout of
`JoyImageEditPipeline`: model_index.json, transformer/, vae/, text_encoder/, tokenizer/, processor/,
scheduler/.

Shapes keep what the serving code depends on: the Wan VAE's 8x spatial downsampling and 16 latent
channels with per-channel latents_mean / latents_std, the transformer's [1, 2, 2] patches, a Qwen3-VL
text encoder with a vision tower (patch 16, 2x2 merge, 2-frame patches, deepstack features) and the
vision special tokens. Everything else shrinks.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from triton_omni.converters.tiny_common import qwen2_tokenizer, randomize, seeded

# The pipeline's system prompt, in the tokenizer's corpus so it takes whole-word pieces.
JOY_SYSTEM = ("Describe the image by detailing the color, shape, size, texture, quantity, text, spatial "
              "relationships of the objects and background:")


def joyai_image_edit(out: Path) -> None:
    """JoyImageEditPipeline: Qwen3-VL text encoder (the input image is part of the prompt; the
    pipeline reads the last decoder layer's output before the final norm),
    JoyImageEditTransformer3DModel (the input image's latents are a second item beside the noise),
    AutoencoderKLWan (16 channels, per-channel latent mean and std) and a flow-match schedule with a
    static shift (the pipeline passes no `mu`, so dynamic shifting cannot be on). processor/ holds
    what `Qwen3VLProcessor` reads (image processor config + tokenizer); it is written by hand because
    transformers cannot save or load that processor without its video processor, which needs
    torchvision."""
    from diffusers import (AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, JoyImageEditPipeline,
                           JoyImageEditTransformer3DModel)
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = qwen2_tokenizer(JOY_SYSTEM)
    token = tokenizer.convert_tokens_to_ids
    hidden = 32
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3],
                                          "mrope_interleaved": True},
                         pad_token_id=token("<|endoftext|>")),
        # The release's patch 16, 2x2 merge and 2-frame patches; one deepstack layer of two.
        vision_config=dict(depth=2, hidden_size=hidden, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                           deepstack_visual_indexes=[0], in_channels=3),
        image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"))
    text_encoder = randomize(Qwen3VLForConditionalGeneration(config), seed=11, std=0.1)
    # head dim 16 = rope_dim_list's sum; text_dim is the encoder's hidden size.
    transformer = seeded(12, lambda: JoyImageEditTransformer3DModel(
        patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2, text_dim=hidden,
        num_layers=2, rope_dim_list=[4, 6, 6], theta=256))
    # The modulation tables start at zero; small random values make every block's shift, scale and
    # gate depend on more than the timestep.
    g = torch.Generator().manual_seed(120)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if name.endswith("modulate_table"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    # Three spatial downsamplings as released (8x); default latents_mean/std are the Wan 2.1 VAE's.
    vae = seeded(13, lambda: AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                              temperal_downsample=[False, True, True]))
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    pipe = JoyImageEditPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                transformer=transformer, processor=None)
    pipe.save_pretrained(str(out))
    # The release's image processor settings except max_pixels: a few patches keep the vision tower
    # quick on a CPU.
    image_processor = Qwen2VLImageProcessorPil(min_pixels=64 * 64, max_pixels=128 * 128, patch_size=16,
                                               temporal_patch_size=2, merge_size=2,
                                               image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    image_processor.save_pretrained(str(out / "processor"))
    tokenizer.save_pretrained(str(out / "processor"))
    index = json.loads((out / "model_index.json").read_text())
    (out / "model_index.json").write_text(json.dumps({**index, "processor": ["transformers", "Qwen3VLProcessor"]},
                                                     indent=2) + "\n")


BUILDERS: dict = {"joyai_image_edit": joyai_image_edit}
