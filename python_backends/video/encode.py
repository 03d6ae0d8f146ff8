"""The last step of a video model (CPU): frames -> an MP4 (H.264, yuv420p, the request's fps).

Its own CPU processes (`instances.count`): while one encodes a clip, the GPU steps go on with the
next requests, so encoding is never on the GPU's critical path.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from triton_omni.media.video import PRESETS, encode_mp4
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, register
from triton_omni.video.request import ServedClips


@dataclass
class VideoEncodeParams(ServedClips):
    crf: int = 18                  # x264's constant quality: 0 lossless, 18 visually lossless, 23 its default
    preset: str = "fast"           # x264's speed / size trade-off (media/video.py PRESETS)
    threads: int = 0               # x264's threads; 0: one per core


@register("video_encode")
class VideoEncode(Step):
    inputs = (
        TensorSpec("frames", "TYPE_UINT8", (-1, -1, -1, 3), ragged=True),
        TensorSpec("fps", "TYPE_INT32", (1,)),
    )
    outputs = (TensorSpec("video", "TYPE_STRING", (1,)),)
    Params = VideoEncodeParams

    def __init__(self, ctx):
        super().__init__(ctx)
        if self.params.preset not in PRESETS:
            raise ValueError(f"parameter preset: expected one of {', '.join(PRESETS)}, got {self.params.preset!r}")
        if not 0 <= self.params.crf <= 51:
            raise ValueError(f"parameter crf: expected 0 to 51, got {self.params.crf}")

    def input_limits(self) -> dict:
        return {"frames": (self.params.max_frames, self.params.max_side, self.params.max_side, None)}

    def one(self, req: Request) -> dict:
        frames, fps = req.get("frames"), int(req.scalar("fps"))
        f, h, w, _ = frames.shape
        if f < 1 or h < 2 or w < 2 or h % 2 or w % 2 or h * w > self.params.max_pixels:
            raise InvalidInput("frames", f"shape {list(frames.shape)}: expected 1 or more frames of even sides and "
                                         f"at most {self.params.max_pixels} pixels")
        if not 1 <= fps <= self.params.max_fps:
            raise InvalidInput("fps", f"must be between 1 and {self.params.max_fps}, got {fps}")
        if hasattr(frames, "cpu"):          # a torch tensor from a GPU step
            frames = frames.cpu().numpy()
        data = encode_mp4(frames, fps, self.params.crf, self.params.preset, self.params.threads)
        return {"video": np.array([data], dtype=np.object_)}
