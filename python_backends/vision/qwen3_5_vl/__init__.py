"""Qwen3.5 image and video -> text: processor (host), vision tower, steps."""
