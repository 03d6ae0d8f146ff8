"""Video out: RGB frames -> an MP4 file (H.264, yuv420p) through PyAV, and reading one back.

The file is what players and browsers take without asking: H.264 in MP4, 4:2:0 chroma (so width and
height must be even), constant frame rate `fps` (frame i at i / fps), and the index at the front of
the file (`+faststart`) so playback can start before the download ends.
"""
from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")


def encode_mp4(frames: np.ndarray, fps: int, crf: int = 18, preset: str = "fast", threads: int = 0) -> bytes:
    """[F, H, W, 3] uint8 RGB frames -> MP4 bytes. `crf`: x264's constant quality (0 lossless, 18
    visually lossless, 23 its default); `preset`: speed against size (PRESETS); `threads`: 0 lets x264
    pick (one per core)."""
    import av

    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise ValueError(f"expected [F, H, W, 3] uint8 frames, got {frames.dtype} {list(frames.shape)}")
    _, height, width, _ = frames.shape
    if height % 2 or width % 2:
        raise ValueError(f"{width}x{height}: yuv420p needs an even width and height")
    if not 1 <= fps <= 240:
        raise ValueError(f"fps {fps}: expected 1 to 240")
    if preset not in PRESETS:
        raise ValueError(f"unknown x264 preset {preset!r}; known: {', '.join(PRESETS)}")
    # A file, not memory: +faststart moves the index to the front in a second pass over the file.
    with tempfile.NamedTemporaryFile(suffix=".mp4") as tmp:
        _write_mp4(av, tmp.name, frames, fps, crf, preset, threads)
        return Path(tmp.name).read_bytes()


def _write_mp4(av, path: str, frames: np.ndarray, fps: int, crf: int, preset: str, threads: int) -> None:
    _, height, width, _ = frames.shape
    with av.open(path, "w", format="mp4", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": str(crf), "preset": preset}
        stream.codec_context.thread_count = threads
        for i, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts = i                          # the stream's time base is 1 / fps
            container.mux(stream.encode(frame))
        container.mux(stream.encode())           # flush the encoder's delayed frames


@dataclass
class DecodedVideo:
    frames: np.ndarray          # [F, H, W, 3] uint8 RGB
    fps: float                  # the stream's average frame rate
    codec: str
    pix_fmt: str


def decode_video(data: bytes) -> DecodedVideo:
    """An encoded video file (any container and codec FFmpeg reads) -> its frames and rate."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return DecodedVideo(np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8),
                            float(stream.average_rate or 0), stream.codec_context.name, stream.codec_context.pix_fmt)
