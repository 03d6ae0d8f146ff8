"""Encoders that several families share (an audio tower used by a speech recogniser and by an omni model)."""
