"""Omnilingual ASR (transformers' OmniASR classes): the wav2vec2-style audio encoder, packed."""
