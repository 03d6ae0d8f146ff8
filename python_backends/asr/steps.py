"""Registers the speech-recognition step classes (imported by python_backends/steps.py)."""
import triton_omni.asr.higgs_audio.steps  # noqa: F401
import triton_omni.asr.llm_decode  # noqa: F401
import triton_omni.asr.llm_post  # noqa: F401
import triton_omni.asr.omniasr.steps  # noqa: F401
import triton_omni.asr.post  # noqa: F401
import triton_omni.asr.pre  # noqa: F401
import triton_omni.asr.qwen3_asr.steps  # noqa: F401
