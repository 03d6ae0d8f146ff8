"""Registers the vision step classes (imported by python_backends/steps.py): one steps module per model family."""
import triton_omni.vision.qwen3_5_vl.steps  # noqa: F401
import triton_omni.vision.vjepa2.steps  # noqa: F401
