"""python_backends/media/audio.py: PCM chunks and files in every response format, read back by PyAV."""
from __future__ import annotations

import numpy as np
import pytest

from triton_omni.media import audio

RATE = 24000


def tone(seconds: float = 0.5, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_pcm_rounds_and_clips():
    wave = np.array([0.0, 1.0, -1.0, 2.0, -2.0, 0.5 / 32767, -0.49 / 32767], dtype=np.float32)
    assert audio.to_pcm16(wave).tolist() == [0, 32767, -32767, 32767, -32768, 0, 0]
    assert audio.pcm_bytes(np.array([1 / 32767], np.float32)) == b"\x01\x00"       # little-endian
    # a chunk boundary never changes a sample: PCM of the halves == PCM of the whole
    w = tone()
    assert audio.pcm_bytes(w[:1000]) + audio.pcm_bytes(w[1000:]) == audio.pcm_bytes(w)
    assert audio.encode(w, RATE, "pcm") == audio.pcm_bytes(w)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_files_round_trip(fmt):
    w = tone()
    data = audio.encode(w, RATE, fmt)
    back, rate = audio.decode(data)
    assert rate == RATE == audio.file_rate(fmt, RATE)
    assert np.array_equal(np.rint(back * 32768).astype(np.int16), audio.to_pcm16(w))   # FFmpeg: s16 / 32768
    assert data[:4] == {"wav": b"RIFF", "flac": b"fLaC"}[fmt]


@pytest.mark.parametrize("fmt,magic", [("mp3", (b"ID3", b"\xff\xfb", b"\xff\xf3")), ("opus", (b"OggS",))])
def test_lossy_files_decode_at_their_rate(fmt, magic):
    w = tone(1.0)
    data = audio.encode(w, RATE, fmt)
    assert data.startswith(magic)
    back, rate = audio.decode(data)
    assert rate == audio.file_rate(fmt, RATE) == (48000 if fmt == "opus" else RATE)
    assert abs(len(back) / rate - 1.0) < 0.08             # encoder delay and padding at most
    # the tone survives: its frequency dominates the spectrum
    spectrum = np.abs(np.fft.rfft(back[: rate // 2]))
    assert abs(np.argmax(spectrum) * 2 - 440) <= 4
    resampled, r = audio.decode(data, rate=RATE)
    assert r == RATE and abs(len(resampled) - RATE) < 0.08 * RATE


def test_empty_audio_is_a_valid_file():
    for fmt in ("wav", "flac"):
        back, rate = audio.decode(audio.encode(np.zeros(0, np.float32), RATE, fmt))
        assert back.size == 0 and rate == RATE


def test_bad_input():
    with pytest.raises(ValueError, match="not a readable audio file"):
        audio.decode(b"this is not audio at all")
    with pytest.raises(ValueError, match="unknown audio format"):
        audio.encode(tone(), RATE, "aac")
