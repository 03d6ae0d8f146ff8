"""Chatterbox TTS: T3 speech tokens, S3Gen waveforms, voice cloning and the steps."""
