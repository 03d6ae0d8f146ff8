"""Registers the image step classes (imported by python_backends/steps.py)."""
import triton_omni.image.bagel  # noqa: F401
import triton_omni.image.encode  # noqa: F401
import triton_omni.image.flux2  # noqa: F401
import triton_omni.image.joyimage  # noqa: F401
import triton_omni.image.pre  # noqa: F401
import triton_omni.image.qwen_image  # noqa: F401
import triton_omni.image.z_image  # noqa: F401
