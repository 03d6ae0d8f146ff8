"""Registers the image step classes (imported by python_backends/steps.py)."""
import python_backends.image.bagel  # noqa: F401
import python_backends.image.encode  # noqa: F401
import python_backends.image.flux2  # noqa: F401
import python_backends.image.joyimage  # noqa: F401
import python_backends.image.pre  # noqa: F401
import python_backends.image.qwen_image  # noqa: F401
import python_backends.image.z_image  # noqa: F401
