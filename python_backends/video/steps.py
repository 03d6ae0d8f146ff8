"""Registers the video step classes (imported by python_backends/steps.py): one steps module per model family."""
import triton_omni.video.encode  # noqa: F401
import triton_omni.video.wan.denoise  # noqa: F401
import triton_omni.video.wan.steps  # noqa: F401
import triton_omni.video.cosmos3.denoise  # noqa: F401
import triton_omni.video.cosmos3.steps  # noqa: F401
