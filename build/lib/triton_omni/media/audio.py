"""Audio in and out: float waveforms <-> PCM s16le chunks and encoded files (WAV, FLAC, MP3, Opus)
through PyAV, and decoding of uploaded reference audio.

Waveforms are mono float32 in [-1, 1]. PCM is signed 16-bit little-endian, the format streamed
chunks use: rounding (not truncation) and clipping, so a chunk boundary never changes a sample.
"""
from __future__ import annotations

import io

import numpy as np

# response_format -> (container, codec). Opus always decodes at 48 kHz (RFC 7845), so Opus files
# are written at 48 kHz: the rate a player reports is the rate we say.
FORMATS = {"wav": ("wav", "pcm_s16le"), "flac": ("flac", "flac"), "mp3": ("mp3", "libmp3lame"),
           "opus": ("ogg", "libopus")}
RESPONSE_FORMATS = ("pcm", *FORMATS)
OPUS_RATE = 48000
MAX_DECODED_SECONDS = 600          # reference audio longer than this is refused


def to_pcm16(wave: np.ndarray) -> np.ndarray:
    """float [-1, 1] -> int16 samples (rounded, clipped)."""
    return np.clip(np.rint(np.asarray(wave, dtype=np.float32) * 32767.0), -32768, 32767).astype(np.int16)


def pcm_bytes(wave: np.ndarray) -> bytes:
    """A raw PCM chunk: s16le mono."""
    return to_pcm16(wave).astype("<i2").tobytes()


def file_rate(fmt: str, rate: int) -> int:
    """The sample rate an encoded file of this format carries (what decoders report)."""
    return OPUS_RATE if fmt == "opus" else rate


def encode(wave: np.ndarray, rate: int, fmt: str) -> bytes:
    """A whole mono waveform as one file in `fmt` (one of RESPONSE_FORMATS)."""
    if fmt == "pcm":
        return pcm_bytes(wave)
    if fmt not in FORMATS:
        raise ValueError(f"unknown audio format {fmt!r}; known: {', '.join(RESPONSE_FORMATS)}")
    import av

    container_fmt, codec = FORMATS[fmt]
    out_rate = file_rate(fmt, rate)
    buf = io.BytesIO()
    with av.open(buf, "w", format=container_fmt) as container:
        stream = container.add_stream(codec, rate=out_rate)
        stream.layout = "mono"
        # the resampler converts to the encoder's sample format (and rate, for Opus) and cuts
        # frames to the encoder's frame size where it has one
        container.start_encoding()      # the header is written even for empty audio
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=out_rate,
                                      frame_size=stream.codec_context.frame_size or None)
        pcm = to_pcm16(wave)
        frames = []
        if pcm.size:
            frame = av.AudioFrame.from_ndarray(pcm[None], format="s16", layout="mono")
            frame.sample_rate = rate
            frames += resampler.resample(frame)
        frames += resampler.resample(None)
        for frame in frames:
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


def decode(data: bytes, rate: int | None = None) -> tuple[np.ndarray, int]:
    """Any audio file PyAV reads -> (mono float32 waveform, sample rate). With `rate`, resampled
    to it. Floats as FFmpeg makes them (s16 / 32768). Raises ValueError for bytes that are not audio."""
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise ValueError("no audio stream")
            stream = container.streams.audio[0]
            out_rate = rate or stream.codec_context.sample_rate
            resampler = av.AudioResampler(format="flt", layout="mono", rate=out_rate)
            chunks, total = [], 0
            for frame in container.decode(stream):
                for f in resampler.resample(frame):
                    chunks.append(f.to_ndarray().reshape(-1))
                    total += chunks[-1].size
                if total > MAX_DECODED_SECONDS * out_rate:
                    raise ValueError(f"longer than {MAX_DECODED_SECONDS} s")
            for f in resampler.resample(None):
                chunks.append(f.to_ndarray().reshape(-1))
    except av.error.FFmpegError as e:
        raise ValueError(f"not a readable audio file ({e.strerror or type(e).__name__})") from None
    wave = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    return wave, int(out_rate)
