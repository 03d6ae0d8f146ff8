"""Orpheus TTS: a Llama talker on the AR engine speaking SNAC audio tokens, and the SNAC decoder."""
