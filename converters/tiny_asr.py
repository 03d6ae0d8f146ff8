"""Tiny random checkpoints for the speech-recognition models (see converters/tiny.py), in the release layouts.

omniasr_ctc  hf-audio/omniasr-ctc-*'s layout: `OmniASRForCTC.save_pretrained` (config.json with model_type
             omniasr_ctc and its audio_config, model.safetensors), the 300M layout's 7-layer conv feature
             extractor at tiny widths, and the `OmniASRCTCProcessor` (preprocessor_config.json for the
             feature extractor; a `ParakeetTokenizer`, tokenizer.json: SentencePiece-style pieces, id 0 the
             CTC blank, which the tokenizer calls its pad token, trained on the corpus).
qwen3_asr    Qwen/Qwen3-ASR-*-hf's layout: `Qwen3ASRForConditionalGeneration.save_pretrained` (config.json with
             model_type qwen3_asr, its audio_config and a Qwen3 text_config; model.safetensors with
             model.audio_tower.*, model.multi_modal_projector.*, model.language_model.*), the release's 128-bin
             Whisper features and 1 s conv chunks at tiny widths (attention windows of 2 chunks, so short
             clips have several), and the `Qwen3ASRProcessor` files (preprocessor_config.json, a
             `Qwen2Tokenizer` with the audio and <asr_text> special tokens, a chat template of the release's
             shape: system context, the audio block, the assistant turn that a language prefills).
omniasr_llm  hf-audio/omniasr-llm-*'s layout: `OmniASRForConditionalGeneration.save_pretrained` (model_type omniasr:
             the CTC models' encoder, a linear projector, a Llama text_config; model.audio_tower.*,
             model.multi_modal_projector.*, model.language_model.*, lm_head), the `OmniASRProcessor` files, a
             tokenizer with the `<extra_id_1>` audio placeholder and `<|lang:...|>` language tokens, and a chat
             template that writes the audio placeholder, the language token and the BOS the text follows.
"""
from __future__ import annotations

from pathlib import Path

# the tokenizer learns these too, so a tiny model's pieces are whole words now and then
ASR_CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, this is a test of speech recognition",
              "she sells sea shells by the sea shore", "one two three four five six seven eight nine ten"]
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]        # ids 0-3; 0 is the CTC blank


def ctc_tokenizer(out: Path):
    """A ParakeetTokenizer over a SentencePiece-style BPE (Metaspace: '▁' marks a word's start)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import ParakeetTokenizer

    from triton_omni.converters.tiny_common import CORPUS

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=SPECIALS, show_progress=False)
    bpe.train_from_iterator((CORPUS + ASR_CORPUS) * 4, trainer)
    tokenizer = ParakeetTokenizer(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    return tokenizer


def omniasr_ctc(out: Path) -> None:
    from transformers import OmniASRCTCConfig, OmniASRCTCProcessor, OmniASRFeatureExtractor, OmniASRForCTC

    from triton_omni.converters.tiny_common import randomize, seeded

    tokenizer = ctc_tokenizer(out)
    OmniASRCTCProcessor(feature_extractor=OmniASRFeatureExtractor(), tokenizer=tokenizer).save_pretrained(str(out))
    audio = dict(hidden_size=32, conv_dim=(16,) * 7, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                 num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    config = OmniASRCTCConfig(vocab_size=len(tokenizer), audio_config=audio, blank_token_id=0, pad_token_id=1)
    model = randomize(seeded(0, lambda: OmniASRForCTC(config)), seed=1, std=0.3).eval()
    model.save_pretrained(str(out))


# ChatML with content parts: text, or the audio block whose <|audio_pad|> the processor expands; the last
# message is left open when it is the assistant's (continue_final_message: a forced language's prefill)
QWEN3_ASR_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{%- if m['content'] is string %}{{ m['content'] }}{%- else %}{%- for c in m['content'] %}"
    "{%- if c['type'] == 'audio' %}{{ '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif c['type'] == 'text' %}{{ c['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{ '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN3_ASR_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
                     "<asr_text>"]


def qwen3_asr_tokenizer():
    """A `Qwen2Tokenizer` (the release's class) over a tiny byte-level BPE, with the audio tokens the
    processor looks up by name (tokenizer.audio_token, audio_bos_token, audio_eos_token)."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    from triton_omni.converters.tiny_common import CORPUS

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=QWEN3_ASR_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    languages = ["language English", "language Chinese", "language French", "language None"]
    bpe.train_from_iterator((CORPUS + ASR_CORPUS + languages) * 4, trainer)
    trained = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]], eos_token="<|im_end|>",
                               pad_token="<|endoftext|>",
                               extra_special_tokens={"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                                                     "audio_eos_token": "<|audio_end|>"})
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN3_ASR_SPECIAL[1:]})
    return tokenizer


def qwen3_asr(out: Path) -> None:
    import json

    from transformers import (Qwen3ASRConfig, Qwen3ASRFeatureExtractor, Qwen3ASRForConditionalGeneration,
                              Qwen3ASRProcessor)

    from triton_omni.converters.tiny_common import randomize, seeded

    tokenizer = qwen3_asr_tokenizer()
    processor = Qwen3ASRProcessor(feature_extractor=Qwen3ASRFeatureExtractor(), tokenizer=tokenizer,
                                  chat_template=QWEN3_ASR_TEMPLATE)
    processor.save_pretrained(str(out))
    token = tokenizer.convert_tokens_to_ids
    hidden = 64
    audio = dict(num_mel_bins=128, d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                 downsample_hidden_size=8, output_dim=hidden, n_window=50, n_window_infer=200)
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True)
    eos = [token("<|endoftext|>"), token("<|im_end|>")]
    config = Qwen3ASRConfig(audio_config=audio, text_config=text, audio_token_id=token("<|audio_pad|>"),
                            timestamp_token_id=token("<|endoftext|>"), pad_token_id=token("<|im_end|>"), eos_token_id=eos)
    model = randomize(seeded(31, lambda: Qwen3ASRForConditionalGeneration(config)), seed=31, std=0.3).eval()
    model.save_pretrained(str(out))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": token("<|im_end|>")},
                                                           indent=2) + "\n")


OMNIASR_LLM_TEMPLATE = (
    "{%- for m in messages %}{%- for c in m['content'] %}"
    "{%- if c['type'] == 'audio' %}{{ '<extra_id_1>' }}"
    "{%- elif c['type'] == 'language' %}{{ '<|lang:' + c['language'] + '|>' }}{%- endif %}"
    "{%- endfor %}{%- endfor %}{%- if add_generation_prompt %}{{ bos_token }}{%- endif %}"
)
OMNIASR_LANGUAGES = ["auto", "eng_latn", "fra_latn", "deu_latn", "cmn_hans"]


def omniasr_llm(out: Path) -> None:
    from transformers import OmniASRConfig, OmniASRFeatureExtractor, OmniASRForConditionalGeneration, OmniASRProcessor

    from triton_omni.converters.tiny_common import randomize, seeded

    tokenizer = ctc_tokenizer(out)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<extra_id_1>"] + [f"<|lang:{c}|>" for c in OMNIASR_LANGUAGES]})
    OmniASRProcessor(feature_extractor=OmniASRFeatureExtractor(), tokenizer=tokenizer, audio_token="<extra_id_1>",
                     chat_template=OMNIASR_LLM_TEMPLATE).save_pretrained(str(out))
    token = tokenizer.convert_tokens_to_ids
    audio = dict(hidden_size=32, conv_dim=(16,) * 7, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                 num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5)
    config = OmniASRConfig(audio_config=audio, text_config=text, audio_token_id=token("<extra_id_1>"),
                           bos_token_id=token("<s>"), pad_token_id=token("<pad>"), eos_token_id=token("</s>"))
    model = randomize(seeded(32, lambda: OmniASRForConditionalGeneration(config)), seed=32, std=0.3).eval()
    model.save_pretrained(str(out))


BUILDERS = {"omniasr_ctc": omniasr_ctc, "qwen3_asr": qwen3_asr, "omniasr_llm": omniasr_llm}
