"""Qwen-Image-Edit and Edit Plus: the steps of their diffusers pipelines."""
