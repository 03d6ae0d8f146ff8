"""Registers the speech-synthesis step classes (imported by python_backends/steps.py)."""
import triton_omni.tts.chatterbox.steps  # noqa: F401
import triton_omni.tts.fish.steps  # noqa: F401
import triton_omni.tts.kokoro.steps  # noqa: F401
import triton_omni.tts.omnivoice.steps  # noqa: F401
import triton_omni.tts.orpheus.codec  # noqa: F401
import triton_omni.tts.orpheus.pre  # noqa: F401
import triton_omni.tts.orpheus.talker  # noqa: F401
import triton_omni.tts.post  # noqa: F401
import triton_omni.tts.qwen3_tts.serve  # noqa: F401
import triton_omni.tts.qwen3_tts.talker  # noqa: F401
