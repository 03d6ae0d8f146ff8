"""Tiny random checkpoints for the speech-recognition models (see converters/tiny.py), in the release layouts.

omniasr_ctc  hf-audio/omniasr-ctc-*'s layout: `OmniASRForCTC.save_pretrained` (config.json with model_type
             omniasr_ctc and its audio_config, model.safetensors), the 300M layout's 7-layer conv feature
             extractor at tiny widths, and the `OmniASRCTCProcessor` (preprocessor_config.json for the
             feature extractor; a `ParakeetTokenizer`, tokenizer.json: SentencePiece-style pieces, id 0 the
             CTC blank, which the tokenizer calls its pad token, trained on the corpus).
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


BUILDERS = {"omniasr_ctc": omniasr_ctc}
