"""Registers the speech-synthesis step classes (imported by python_backends/steps.py)."""
import python_backends.tts.chatterbox_steps  # noqa: F401
import python_backends.tts.codec  # noqa: F401
import python_backends.tts.kokoro_steps  # noqa: F401
import python_backends.tts.omnivoice_steps  # noqa: F401
import python_backends.tts.post  # noqa: F401
import python_backends.tts.pre  # noqa: F401
import python_backends.tts.qwen3_tts_serve  # noqa: F401
import python_backends.tts.qwen3_tts_steps  # noqa: F401
import python_backends.tts.talker  # noqa: F401
import python_backends.tts.fish_steps  # noqa: F401
