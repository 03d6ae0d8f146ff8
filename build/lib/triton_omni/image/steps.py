"""Registers the image step classes (imported by python_backends/steps.py): one steps module per model family."""
import triton_omni.image.bagel.steps  # noqa: F401
import triton_omni.image.encode  # noqa: F401
import triton_omni.image.flux2.steps  # noqa: F401
import triton_omni.image.joyimage.steps  # noqa: F401
import triton_omni.image.qwen_image.steps  # noqa: F401
import triton_omni.image.z_image.steps  # noqa: F401
