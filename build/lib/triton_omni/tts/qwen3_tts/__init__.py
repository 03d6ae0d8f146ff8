"""Qwen3-TTS (12 Hz): the talker and code predictor, voice cloning, the speech tokenizer's decoder and its steps."""
