"""Qwen3-Omni: the thinker (speech, text in; text out, streamed)."""
