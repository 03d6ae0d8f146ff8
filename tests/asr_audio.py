"""Speech for the recognition tests: espeak-ng speaks a sentence to a WAV; PyAV re-encodes audio to every
container and codec users send (tests/test_asr_*.py)."""
from __future__ import annotations

import io
import shutil
import subprocess

import av
import numpy as np

SENTENCE = "Hello world, this is a test of speech recognition."
# name -> (container, codec, channels, rate): each of the formats the transcription route reads
FORMATS = {"wav": ("wav", "pcm_s16le", 2, 44100), "flac": ("flac", "flac", 1, 22050),
           "mp3": ("mp3", "libmp3lame", 2, 44100), "opus": ("ogg", "libopus", 1, 48000),
           "m4a": ("ipod", "aac", 2, 44100), "webm": ("webm", "libopus", 2, 48000)}


def espeak_wav(text: str = SENTENCE) -> bytes:
    """espeak-ng's own WAV (22,050 Hz mono s16)."""
    if shutil.which("espeak-ng") is None:
        import pytest

        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    return subprocess.run(["espeak-ng", "--stdout", text], check=True, capture_output=True).stdout


def encode_as(wave: np.ndarray, rate: int, container: str, codec: str, channels: int = 1,
              out_rate: int | None = None) -> bytes:
    """A mono float waveform as a file: `container` with `codec`, `channels` (copies), at `out_rate`."""
    out_rate = out_rate or rate
    layout = "mono" if channels == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as c:
        stream = c.add_stream(codec, rate=out_rate)
        stream.layout = layout
        c.start_encoding()
        resampler = av.AudioResampler(format=stream.format.name, layout=layout, rate=out_rate,
                                      frame_size=stream.codec_context.frame_size or None)
        pcm = np.clip(np.rint(np.asarray(wave) * 32767), -32768, 32767).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(pcm[None], format="s16", layout="mono")
        frame.sample_rate = rate
        for f in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(f):
                c.mux(packet)
        for packet in stream.encode(None):
            c.mux(packet)
    return buf.getvalue()


def every_format(wave: np.ndarray, rate: int) -> dict[str, bytes]:
    return {name: encode_as(wave, rate, *spec) for name, spec in FORMATS.items()}
