"""Audio decoding for speech recognition (python_backends/media/audio.py): every container users send at
any rate and channel count -> 16 kHz mono float32, and a clear error for bytes that are not such a file."""
from __future__ import annotations

import re
import struct

import numpy as np
import pytest

from triton_omni.media import audio
from tests.asr_audio import FORMATS, encode_as

RATE = 16000


def chirp(seconds: float = 2.0, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.4 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32)


def aligned_correlation(a: np.ndarray, b: np.ndarray, most_lag: int = 3000) -> float:
    """The best correlation of a and b over shifts up to most_lag (codecs add a delay)."""
    n = min(a.size, b.size) - most_lag
    size = 1 << (a.size + n).bit_length()
    cross = np.fft.irfft(np.fft.rfft(a, size) * np.conj(np.fft.rfft(b[:n], size)), size)[:most_lag]
    lag = int(np.argmax(cross))
    return float(np.corrcoef(a[lag:lag + n], b[:n])[0, 1])


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_decodes_to_16k_mono(name):
    source = chirp()
    data = encode_as(source, RATE, *FORMATS[name])
    assert audio.sniff(data) is not None
    wave, rate = audio.decode(data, RATE)
    assert rate == RATE and wave.dtype == np.float32 and wave.ndim == 1
    assert abs(wave.size - source.size) < 0.08 * RATE                     # codec delay and padding at most
    assert aligned_correlation(wave, source) > (0.999 if name in ("wav", "flac") else 0.95)


def test_stereo_is_mixed_down_and_rates_are_resampled():
    left = chirp(1.0, 44100)
    data = encode_as(left, 44100, "wav", "pcm_s16le", channels=2)          # both channels the same
    wave, rate = audio.decode(data, RATE)
    assert rate == RATE and abs(wave.size - RATE) <= 2
    assert aligned_correlation(wave, chirp(1.0), 50) > 0.999 and 0.35 < np.abs(wave).max() < 0.45


@pytest.mark.parametrize("data, message", [
    (b"", "is empty (0 bytes)"),
    (b"definitely not audio", "not a readable audio file (unknown format"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "not a readable audio file (unknown format"),
    (b"fLaC" + b"\x07" * 200, "not a readable audio file (FLAC container"),
])
def test_bytes_that_are_no_audio_file(data, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        audio.decode(data, RATE)


def test_broken_header_rate_and_length_bounds():
    wav = audio.encode(chirp(1.0), RATE, "wav")
    for rate in (0, 1, 2**31 - 1):
        bad = bytearray(wav)
        bad[24:28] = struct.pack("<I", rate)                              # the header's sample rate
        with pytest.raises(ValueError, match="sample rate|not a readable audio file"):
            audio.decode(bytes(bad), RATE)
    with pytest.raises(ValueError, match=r"is too long: more than 0.5 s"):
        audio.decode(wav, RATE, max_seconds=0.5)
    flac = audio.encode(chirp(1.0), RATE, "flac")
    with pytest.raises(ValueError, match="not a readable audio file"):
        audio.decode(flac[:len(flac) // 2], RATE)                          # cut in the middle of a frame


def test_plain_wav_is_read_without_ffmpeg_as_ffmpeg_reads_it(monkeypatch):
    """Mono s16 / float WAVs at the wanted rate skip FFmpeg (a machine without PyAV reads them): the same samples."""
    source = chirp(0.5)
    s16 = audio.encode(source, RATE, "wav")
    f32 = encode_as(source, RATE, "wav", "pcm_f32le")
    fast = [audio.decode(d, RATE)[0] for d in (s16, f32)]
    assert audio.plain_wav(s16, RATE) is not None and audio.plain_wav(s16, 22050) is None
    monkeypatch.setattr(audio, "plain_wav", lambda data, rate: None)
    for data, got in zip((s16, f32), fast):
        assert np.array_equal(got, audio.decode(data, RATE)[0])
