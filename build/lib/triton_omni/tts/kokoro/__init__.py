"""Kokoro-82M: the StyleTTS2-style model, its phoneme front end and the steps."""
