"""Uploaded video in: decode with PyAV (FFmpeg), sample frames, RGB frames out.

Like image decoding, this is where untrusted bytes come in, so it bounds the work before doing it:
the stream's frame size against a pixel budget, the frames decoded against a cap, and it refuses
empty, truncated or frameless files with a message saying which. Frames are sampled the way the
Qwen-VL processors do it (uniformly over the clip: `fps` frames a second, at least `min_frames`, at
most `max_frames` and the clip's own count), or a fixed number of them (V-JEPA2's clips).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np


class VideoDecodeError(ValueError):
    """The bytes are not a video this server can read (the message says why)."""


@dataclass
class DecodedVideo:
    frames: list[np.ndarray]      # the sampled frames, [H, W, 3] uint8 RGB each
    indices: np.ndarray           # their frame numbers in the clip
    fps: float                    # the clip's frame rate (timestamps are index / fps)
    total_frames: int


@dataclass(frozen=True)
class VideoLimits:
    max_bytes: int = 64 << 20
    max_frame_pixels: int = 4096 * 2160      # a frame's width x height at most (4K)
    max_decoded_frames: int = 18000          # frames read to sample from (10 minutes at 30 fps)


def sample_indices(total: int, video_fps: float, fps: float | None, num_frames: int | None,
                   min_frames: int = 1, max_frames: int = 768) -> np.ndarray:
    """Which frames to keep: `num_frames` of them, or `fps` a second, uniformly from first to last
    (transformers' Qwen3-VL `sample_frames` rule), clamped to [min_frames, max_frames] and the total."""
    if num_frames is None:
        want = int(total / video_fps * fps) if fps else total
        num_frames = min(max(want, min_frames), max_frames, total)
    num_frames = max(1, min(num_frames, total))
    return np.linspace(0, total - 1, num_frames).round().astype(int)


def _open(data: bytes, limits: VideoLimits):
    import av

    if not data:
        raise VideoDecodeError("empty video data")
    if len(data) > limits.max_bytes:
        raise VideoDecodeError(f"{len(data)} bytes; at most {limits.max_bytes} are accepted")
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except Exception as e:  # noqa: BLE001 - any demuxer failure is the client's bytes
        raise VideoDecodeError(f"not a recognised video ({len(data)} bytes): {e}") from None
    if not container.streams.video:
        container.close()
        raise VideoDecodeError("the file has no video stream")
    stream = container.streams.video[0]
    w, h = stream.codec_context.width, stream.codec_context.height
    if w * h > limits.max_frame_pixels:
        container.close()
        raise VideoDecodeError(f"frames are {w}x{h}; at most {limits.max_frame_pixels} pixels a frame are accepted")
    return container, stream


def _frames(data: bytes, limits: VideoLimits):
    """Every decoded frame in order (av.VideoFrame), at most limits.max_decoded_frames."""
    container, stream = _open(data, limits)
    try:
        n = 0
        for frame in container.decode(stream):
            n += 1
            if n > limits.max_decoded_frames:
                raise VideoDecodeError(f"more than {limits.max_decoded_frames} frames; shorter clips only")
            yield frame
    except VideoDecodeError:
        raise
    except Exception as e:  # noqa: BLE001 - corrupt packets
        raise VideoDecodeError(f"corrupt or truncated video data: {e}") from None
    finally:
        container.close()


def decode_video(data: bytes, fps: float | None = 2.0, num_frames: int | None = None, min_frames: int = 1,
                 max_frames: int = 768, limits: VideoLimits = VideoLimits()) -> DecodedVideo:
    """Encoded bytes (MP4, WebM, MKV, ...) -> the sampled frames. The clip is read twice when its
    container does not say how many frames it has (once to count, once to keep the sampled ones), so
    at most the sampled frames are ever held as RGB."""
    container, stream = _open(data, limits)
    rate = stream.average_rate or stream.guessed_rate
    video_fps = float(rate) if rate else 24.0
    total = stream.frames
    container.close()
    if total <= 0 or total > limits.max_decoded_frames:
        total = sum(1 for _ in _frames(data, limits))
    if total == 0:
        raise VideoDecodeError("the video has no frames")
    indices = sample_indices(total, video_fps, fps, num_frames, min_frames, max_frames)
    wanted: dict[int, int] = {}
    for i in indices.tolist():
        wanted[i] = wanted.get(i, 0) + 1
    frames, last = [], None
    for i, frame in enumerate(_frames(data, limits)):
        if i in wanted:
            rgb = frame.to_ndarray(format="rgb24")
            frames += [rgb] * wanted[i]
        last = frame
        if len(frames) == len(indices):
            break
    if len(frames) < len(indices):        # the header over-counted: the last frames are repeats of the final one
        if last is None:
            raise VideoDecodeError("the video has no decodable frames")
        rgb = last.to_ndarray(format="rgb24")
        frames += [rgb] * (len(indices) - len(frames))
    return DecodedVideo(frames, indices, video_fps, total)


def encode_test_video(frames: list[np.ndarray], fps: int = 4, codec: str = "libx264") -> bytes:
    """RGB frames -> an MP4 (for tests, examples and benchmarks: real encoded input)."""
    import av

    buf = io.BytesIO()
    h, w = frames[0].shape[:2]
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for rgb in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()
