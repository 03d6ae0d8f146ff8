"""Tiny random vision checkpoints (see converters/tiny.py): Qwen3.5 with its vision tower (the
`Qwen3_5ForConditionalGeneration` layout and processor configs), V-JEPA2 (`VJEPA2Model`), and a
Qwen3-Embedding-style text embedder (`Qwen3Model`)."""
from __future__ import annotations

import json
from pathlib import Path

from triton_omni.converters.tiny_common import build_tokenizer, qwen2_tokenizer, randomize, seeded

# Qwen-VL's chat template for content parts, cut down: text, then a vision block per image or video.
VL_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{%- if m['content'] is string %}{{ m['content'] }}{%- else %}{%- for c in m['content'] %}"
    "{%- if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- else %}{{ c['text'] }}{%- endif %}{%- endfor %}{%- endif %}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)
VL_CORPUS = "Describe the image. What happens in the video? <0.5 seconds> <1.5 seconds> <2.0 seconds>"
IMAGE_MEAN, IMAGE_STD = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]


def qwen3_5_vl(out: Path) -> None:
    """Qwen3.5's layout at toy size: 4 decoder layers (3 Gated DeltaNet, 1 attention) with the release's
    interleaved multimodal rope, and a 2-block vision tower with the release's 16-pixel patches, 2x2
    merge and 2-frame temporal patches. Processor budgets are small (at most 128x128 pixels an image)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = qwen2_tokenizer(VL_CORPUS)
    tokenizer.chat_template = VL_TEMPLATE
    tokenizer.save_pretrained(str(out))
    token = tokenizer.convert_tokens_to_ids
    hidden = 64
    config = Qwen3_5Config(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                         linear_conv_kernel_dim=4, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                          "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                         eos_token_id=token("<|im_end|>"), pad_token_id=token("<|endoftext|>")),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64),
        image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"),
        tie_word_embeddings=True)
    model = randomize(seeded(28, lambda: Qwen3_5ForConditionalGeneration(config)), seed=28, std=0.25)
    model.save_pretrained(str(out))
    Qwen2VLImageProcessorPil(min_pixels=32 * 32, max_pixels=128 * 128, patch_size=16, temporal_patch_size=2,
                             merge_size=2, image_mean=IMAGE_MEAN, image_std=IMAGE_STD).save_pretrained(str(out))
    video = {"video_processor_type": "Qwen3VLVideoProcessor", "size": {"shortest_edge": 32 * 32, "longest_edge": 8 * 64 * 64},
             "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "fps": 2, "min_frames": 2, "max_frames": 16,
             "image_mean": IMAGE_MEAN, "image_std": IMAGE_STD, "do_sample_frames": True}
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    gen = {"eos_token_id": [token("<|im_end|>"), token("<|endoftext|>")]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def vjepa2(out: Path) -> None:
    """V-JEPA2's layout at toy size: 32x32 crops of 8-pixel patches, 2-frame tubelets, 2 blocks, and
    its predictor (in the checkpoint, not served)."""
    from transformers import VJEPA2Config, VJEPA2Model

    config = VJEPA2Config(crop_size=32, patch_size=8, frames_per_clip=8, tubelet_size=2, hidden_size=48,
                          num_attention_heads=3, num_hidden_layers=2, mlp_ratio=2.0, pred_hidden_size=24,
                          pred_num_attention_heads=2, pred_num_hidden_layers=1, pred_num_mask_tokens=2)
    model = randomize(seeded(29, lambda: VJEPA2Model(config)), seed=29, std=0.2)
    model.save_pretrained(str(out))
    # the release's video processor settings (resize to crop * 256 / 224, centre crop, ImageNet statistics)
    processor = {"video_processor_type": "VJEPA2VideoProcessor", "crop_size": {"height": 32, "width": 32},
                 "size": {"shortest_edge": int(32 * 256 / 224)}, "do_center_crop": True, "do_normalize": True,
                 "do_rescale": True, "rescale_factor": 1 / 255, "image_mean": [0.485, 0.456, 0.406],
                 "image_std": [0.229, 0.224, 0.225], "resample": 2}
    (out / "video_preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")


def qwen3_embedding(out: Path) -> None:
    """Qwen3-Embedding's layout: a Qwen3 base model (no lm_head) whose last token's hidden state is the
    embedding; its tokenizer ends every text with <|endoftext|> (the release's post-processor)."""
    from tokenizers import processors
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = build_tokenizer(out)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B <|endoftext|>", special_tokens=[("<|endoftext|>", eos)])
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(str(out))
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
                         eos_token_id=eos, pad_token_id=eos)
    model = randomize(seeded(30, lambda: Qwen3Model(config)), seed=30, std=0.25)
    model.save_pretrained(str(out))


BUILDERS: dict = {"qwen3_5_vl": qwen3_5_vl, "vjepa2": vjepa2, "qwen3_embedding": qwen3_embedding}
