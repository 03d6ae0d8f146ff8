"""Tiny random Qwen3-Omni checkpoint (see converters/tiny.py), in Qwen/Qwen3-Omni-30B-A3B-Instruct's layout:
`Qwen3OmniMoeForConditionalGeneration.save_pretrained` (config.json with model_type qwen3_omni_moe, its
thinker_config (audio_config, vision_config, a MoE text_config with the release's interleaved multimodal
rope) and talker / code2wav configs; model.safetensors with thinker.audio_tower.*, thinker.visual.*,
thinker.model.*, thinker.lm_head.*, talker.*, code2wav.*), at toy widths: a 2-layer audio tower with the
release's 128-bin Whisper features and 1 s conv chunks (attention windows of 2 chunks, so short clips
have several), a 2-block vision tower, a 2-layer thinker of 8 experts (2 a token), a 1-layer talker.
The `Qwen3OmniMoeProcessor` files: a `Qwen2Tokenizer` with the audio and vision special tokens the
processor looks up by name, the Whisper feature extractor, the Qwen2-VL image and video processors, and
a chat template of the release's shape (audio and vision blocks inside the user turn).
"""
from __future__ import annotations

import json
from pathlib import Path

from triton_omni.converters.tiny_common import CORPUS, randomize, seeded

# ChatML with content parts: text, or the audio / vision block whose pad token the processor expands
OMNI_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{%- if m['content'] is string %}{{ m['content'] }}{%- else %}{%- for c in m['content'] %}"
    "{%- if c['type'] == 'audio' or c['type'] == 'input_audio' %}{{ '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif c['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif c['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif c['type'] == 'text' %}{{ c['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{ '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
OMNI_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
                "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
OMNI_CORPUS = ["What is said in this clip?", "Describe the sound.", "Transcribe the audio.", "Describe the image."]


def omni_tokenizer():
    """A `Qwen2Tokenizer` (the release's class) over a tiny byte-level BPE, with the special tokens
    Qwen3OmniMoeProcessor reads off the tokenizer (audio_token, image_token, ..., audio_bos_token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=OMNI_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator((CORPUS + OMNI_CORPUS) * 4, trainer)
    trained = json.loads(bpe.to_str())["model"]
    named = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
             "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
             "vision_eos_token": "<|vision_end|>"}
    tokenizer = Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]],
                               eos_token="<|im_end|>", pad_token="<|endoftext|>", extra_special_tokens=named)
    tokenizer.add_special_tokens({"additional_special_tokens": OMNI_SPECIAL[1:]})
    return tokenizer


def qwen3_omni(out: Path) -> None:
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = omni_tokenizer()
    features = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400,
                                       return_attention_mask=True)
    images = Qwen2VLImageProcessorPil(min_pixels=32 * 32, max_pixels=128 * 128, patch_size=16, temporal_patch_size=2,
                                      merge_size=2)
    # the processor's parts one by one, as Qwen3OmniMoeProcessor.save_pretrained writes them (the processor
    # itself cannot be built without torchvision, which its video processor needs and this environment lacks)
    tokenizer.chat_template = OMNI_TEMPLATE
    tokenizer.save_pretrained(str(out))
    # one preprocessor_config.json holds both the feature extractor's and the image processor's keys (as
    # the release's does)
    merged = {**images.to_dict(), **features.to_dict(), "processor_class": "Qwen3OmniMoeProcessor"}
    merged.pop("mel_filters", None)
    (out / "preprocessor_config.json").write_text(json.dumps(merged, indent=2) + "\n")
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen3OmniMoeProcessor"}, indent=2) + "\n")
    video = {"video_processor_type": "Qwen2VLVideoProcessor", "patch_size": 16, "temporal_patch_size": 2,
             "merge_size": 2, "size": {"shortest_edge": 32 * 32, "longest_edge": 8 * 64 * 64}}
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    token = tokenizer.convert_tokens_to_ids
    hidden = 64
    audio = dict(num_mel_bins=128, d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                 downsample_hidden_size=8, output_dim=hidden, n_window=50, n_window_infer=200, max_source_positions=64)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0])
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 2, 2],
                                 "mrope_interleaved": True, "interleaved": True})
    thinker = dict(audio_config=audio, vision_config=vision, text_config=text, audio_token_id=token("<|audio_pad|>"),
                   image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
                   audio_start_token_id=token("<|audio_start|>"), vision_start_token_id=token("<|vision_start|>"),
                   user_token_id=token("user"), position_id_per_seconds=13)
    talker_text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                       shared_expert_intermediate_size=32,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 2, 2],
                                        "mrope_interleaved": True, "interleaved": True})
    predictor = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=16, num_code_groups=4)
    talker = dict(text_config=talker_text, code_predictor_config=predictor, num_code_groups=4, thinker_hidden_size=hidden,
                  accept_hidden_layer=1, codec_eos_token_id=60, codec_nothink_id=61, codec_think_bos_id=62,
                  codec_think_eos_id=63, codec_pad_id=58, codec_bos_id=59, audio_token_id=token("<|audio_pad|>"),
                  image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
                  vision_start_token_id=token("<|vision_start|>"), audio_start_token_id=token("<|audio_start|>"),
                  spatial_merge_size=2, speaker_id={"ethan": 57})
    code2wav = dict(codebook_size=64, hidden_size=32, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
                    num_hidden_layers=1, num_quantizers=4, decoder_dim=32, sliding_window=8)
    config = Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
                                im_start_token_id=token("<|im_start|>"), im_end_token_id=token("<|im_end|>"),
                                user_token_id=token("user"), assistant_token_id=token("assistant"),
                                system_token_id=token("system"))
    model = randomize(seeded(37, lambda: Qwen3OmniMoeForConditionalGeneration(config)), seed=37, std=0.25).eval()
    model.save_pretrained(str(out))
    eos = [token("<|im_end|>"), token("<|endoftext|>")]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": token("<|endoftext|>")},
                                                           indent=2) + "\n")


BUILDERS: dict = {"qwen3_omni": qwen3_omni}
