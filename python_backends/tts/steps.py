"""Registers the speech-synthesis step classes (imported by python_backends/steps.py)."""
import triton_omni.tts.chatterbox_steps  # noqa: F401
import triton_omni.tts.codec  # noqa: F401
import triton_omni.tts.kokoro_steps  # noqa: F401
import triton_omni.tts.omnivoice_steps  # noqa: F401
import triton_omni.tts.post  # noqa: F401
import triton_omni.tts.pre  # noqa: F401
import triton_omni.tts.qwen3_tts_serve  # noqa: F401
import triton_omni.tts.qwen3_tts_steps  # noqa: F401
import triton_omni.tts.talker  # noqa: F401
import triton_omni.tts.fish_steps  # noqa: F401
