"""Audio in and out: float waveforms <-> PCM s16le chunks and encoded files (WAV, FLAC, MP3, Opus)
through PyAV, and decoding of uploaded audio (reference clips, speech to transcribe) in any of the
containers users send (WAV, FLAC, MP3, Ogg, M4A, WebM, ...).

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
MAX_DECODED_SECONDS = 600          # audio longer than this is refused (unless the caller says otherwise)


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


# What `decode` reads, by the file's first bytes: the container is chosen here, never by FFmpeg's
# probe, so bytes that are no audio file get a clear error and no other demuxer (a playlist that
# names other files, an image sequence) ever reads them.
CONTAINERS = {"wav": "WAV", "flac": "FLAC", "mp3": "MP3", "ogg": "Ogg (Opus, Vorbis, FLAC)", "mov": "M4A / MP4 (AAC, ALAC)",
              "matroska": "WebM / Matroska", "aac": "AAC (ADTS)", "aiff": "AIFF", "caf": "CAF", "amr": "AMR",
              "asf": "WMA / ASF"}
MIN_RATE, MAX_RATE = 1000, 768000  # sample rates a file's header may state
MAX_CHANNELS = 64


def sniff(data: bytes) -> str | None:
    """The container of an audio file from its magic bytes (a key of CONTAINERS), or None."""
    head = data[:16]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE" or head[:4] in (b"RF64", b"BW64"):
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[4:8] == b"ftyp":
        return "mov"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"caff":
        return "caf"
    if head[:5] == b"#!AMR":
        return "amr"
    if head[:8] == bytes.fromhex("3026b2758e66cf11"):
        return "asf"
    if head[:3] == b"ID3":
        return "mp3"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        # an MPEG audio frame sync; layer bits 00 are ADTS AAC's
        return "aac" if (head[1] >> 1) & 3 == 0 else "mp3"
    return None


def plain_wav(data: bytes, rate: int | None) -> tuple[np.ndarray, int] | None:
    """(samples, rate) of a mono 16-bit PCM or 32-bit float WAV already at `rate` (None: any), read with
    numpy: what FFmpeg decodes it to (s16 / 32768), without FFmpeg (so a machine without PyAV reads such
    WAVs too). None for any other file (FFmpeg reads those)."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    at, fmt = 12, None
    while at + 8 <= len(data):
        kind, size = data[at:at + 4], int.from_bytes(data[at + 4:at + 8], "little")
        body = data[at + 8:at + 8 + size]
        if kind == b"fmt " and len(body) >= 16:
            tag, channels, own_rate = (int.from_bytes(body[i:j], "little") for i, j in ((0, 2), (2, 4), (4, 8)))
            fmt = (tag, channels, own_rate, int.from_bytes(body[14:16], "little"))
        elif kind == b"data":
            if fmt is None or fmt[1] != 1 or fmt[0:4:3] not in ((1, 16), (3, 32)) or not MIN_RATE <= fmt[2] <= MAX_RATE \
                    or (rate is not None and fmt[2] != rate):
                return None
            width = fmt[3] // 8
            body = body[:len(body) // width * width]        # a streamed WAV's sizes may overstate it
            if fmt[0] == 1:
                return np.frombuffer(body, "<i2").astype(np.float32) / np.float32(32768), fmt[2]
            return np.frombuffer(body, "<f4").astype(np.float32), fmt[2]
        at += 8 + size + (size & 1)
    return None


def decode(data: bytes, rate: int | None = None, max_seconds: float = MAX_DECODED_SECONDS) -> tuple[np.ndarray, int]:
    """An audio file (one of CONTAINERS, any sample rate and channel count) -> (mono float32 waveform,
    sample rate). With `rate`, resampled to it by FFmpeg; channels are mixed down by FFmpeg's matrix.
    Floats as FFmpeg makes them (s16 / 32768). Raises ValueError, phrased to follow the field's name
    ("is empty", "not a readable audio file (...)"), for bytes that are not such a file, a header
    with an impossible rate or channel count, or more than `max_seconds` of audio (decoding stops
    there: a small compressed file cannot make the server decode hours)."""
    if not data:
        raise ValueError("is empty (0 bytes)")
    plain = plain_wav(data, rate)
    if plain is not None:
        if plain[0].size > max_seconds * plain[1]:
            raise ValueError(f"is too long: more than {max_seconds:g} s of audio; at most {max_seconds:g} s are accepted")
        return plain
    import av

    container_format = sniff(data)
    if container_format is None:
        raise ValueError(f"not a readable audio file (unknown format, first bytes {data[:8].hex(' ')}); "
                         f"accepted: {', '.join(CONTAINERS.values())}")
    try:
        with av.open(io.BytesIO(data), format=container_format) as container:
            if not container.streams.audio:
                raise ValueError(f"has no audio stream ({CONTAINERS[container_format]} container)")
            stream = container.streams.audio[0]
            own_rate, channels = stream.codec_context.sample_rate, stream.codec_context.channels
            if not MIN_RATE <= own_rate <= MAX_RATE:
                raise ValueError(f"states a sample rate of {own_rate} Hz; accepted: {MIN_RATE} to {MAX_RATE} Hz")
            if not 1 <= channels <= MAX_CHANNELS:
                raise ValueError(f"states {channels} channels; accepted: 1 to {MAX_CHANNELS}")
            out_rate = rate or own_rate
            resampler = av.AudioResampler(format="flt", layout="mono", rate=out_rate)
            chunks, total, most = [], 0, int(max_seconds * out_rate)
            for frame in container.decode(stream):
                if not MIN_RATE <= frame.sample_rate <= MAX_RATE:
                    raise ValueError(f"has a frame at {frame.sample_rate} Hz; accepted: {MIN_RATE} to {MAX_RATE} Hz")
                for f in resampler.resample(frame):
                    chunks.append(f.to_ndarray().reshape(-1))
                    total += chunks[-1].size
                if total > most:
                    raise ValueError(f"is too long: more than {max_seconds:g} s of audio; at most {max_seconds:g} s "
                                     "are accepted")
            for f in resampler.resample(None):
                chunks.append(f.to_ndarray().reshape(-1))
    except av.error.FFmpegError as e:
        raise ValueError(f"not a readable audio file ({CONTAINERS[container_format]} container: "
                         f"{e.strerror or type(e).__name__})") from None
    wave = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    return wave, int(out_rate)
