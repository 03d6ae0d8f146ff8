"""Imports every module that registers a step, so `STEPS` is complete (used by the converter)."""
import python_backends.ar.step  # noqa: F401
import python_backends.image.steps  # noqa: F401
import python_backends.text.chat  # noqa: F401
import python_backends.tts.steps  # noqa: F401
