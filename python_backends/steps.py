"""Imports every module that registers a step, so `STEPS` is complete (used by the converter)."""
import triton_omni.ar.embeds_step  # noqa: F401
import triton_omni.ar.step  # noqa: F401
import triton_omni.asr.steps  # noqa: F401
import triton_omni.image.steps  # noqa: F401
import triton_omni.omni.steps  # noqa: F401
import triton_omni.text.chat  # noqa: F401
import triton_omni.text.embed  # noqa: F401
import triton_omni.tts.steps  # noqa: F401
import triton_omni.video.steps  # noqa: F401
import triton_omni.vision.steps  # noqa: F401
