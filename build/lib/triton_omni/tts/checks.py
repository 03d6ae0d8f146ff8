"""Checks a speech step runs on the tensors it reads, so a malformed one fails as INVALID_ARG naming it.

The adapter (runtime/guards.py) has already checked ranks and bounded lengths. What is left is the
values: counts that must agree, ids that index a table, floats that must be finite. Any step can be
called directly by a client, so an internal step checks what its producer would have got right.

Values are read on the host only: a client's tensors arrive in host memory. A CUDA tensor was made by
the GPU step before (trusted, and reading it would sync the device), so its values are not checked.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request


def on_host(value: Any) -> np.ndarray | None:
    """A numpy view of an input held in host memory; None for a CUDA tensor."""
    if value is None:
        return None
    if hasattr(value, "is_cuda"):
        return None if value.is_cuda else value.numpy()
    return np.asarray(value)


def ids_in_range(name: str, value: Any, high: int, low: int = 0) -> None:
    """Every id in [low, high) (an embedding table's rows); checked on the host only."""
    ids = on_host(value)
    if ids is not None and ids.size and (int(ids.min()) < low or int(ids.max()) >= high):
        raise InvalidInput(name, f"has values outside [{low}, {high}): min {int(ids.min())}, max {int(ids.max())}")


def finite(name: str, value: Any) -> None:
    """No NaN or infinity (checked on the host only)."""
    values = on_host(value)
    if values is not None and values.size and not np.isfinite(values).all():
        raise InvalidInput(name, "has values that are not finite numbers")


def whole(name: str, size: int, width: int, what: str = "frames") -> int:
    """`size` values make whole rows of `width`; returns the row count."""
    if size % width:
        raise InvalidInput(name, f"{size} values are not whole {what} of {width}")
    return size // width


def int_scalar(req: Request, name: str, low: int, high: int) -> int:
    """A one-value integer input in [low, high]."""
    value = int(req.scalar(name))
    if not low <= value <= high:
        raise InvalidInput(name, f"must be in [{low}, {high}], got {value}")
    return value


def float_scalar(req: Request, name: str, low: float, high: float, default: float | None = None) -> float:
    """A one-value float input in [low, high] (NaN is not)."""
    value = float(req.scalar(name, default))
    if not (math.isfinite(value) and low <= value <= high):
        raise InvalidInput(name, f"must be a number in [{low}, {high}], got {value}")
    return value


# the rates a speech step may hand on (those the encoders of media/audio.py write); every model's is one
SAMPLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
MAX_AUDIO_SECONDS = 1200.0      # default bound of a waveform between steps: 20 min (Kokoro's 4096 characters at speed 0.25)


def max_samples(max_seconds: float) -> int:
    """The most samples a waveform of `max_seconds` has at any of SAMPLE_RATES (the bound on its length
    before its rate is read)."""
    return int(max_seconds * max(SAMPLE_RATES))


def waveform(req: Request, max_seconds: float) -> tuple[np.ndarray, int]:
    """`waveform` (float, on the host) and `sample_rate`, checked: a known rate, at most `max_seconds`
    long at that rate, finite samples."""
    rate = int(req.scalar("sample_rate"))
    if rate not in SAMPLE_RATES:
        raise InvalidInput("sample_rate", f"expected one of {', '.join(map(str, SAMPLE_RATES))}, got {rate}")
    wave = req.get("waveform")
    wave = wave.cpu().numpy() if hasattr(wave, "cpu") else np.asarray(wave)
    if wave.size > max_seconds * rate:
        raise InvalidInput("waveform", f"{wave.size} samples at {rate} Hz; at most {max_seconds:g} s are accepted")
    finite("waveform", wave)
    return wave, rate
