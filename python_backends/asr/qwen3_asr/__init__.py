"""Qwen3-ASR (transformers' Qwen3ASR classes): the audio encoder packed, its outputs a Qwen3 decoder's prompt."""
