"""Moved to encoders/attention.py (shared with the omni family); kept for the importers here."""
from triton_omni.encoders.attention import packed_attention  # noqa: F401
