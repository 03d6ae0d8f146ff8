"""The first step of a video model (CPU): check the request, fill in defaults, tokenize, and decode and
resize the first frame.

It outputs the request's settings as typed tensors for the GPU steps, the prompt (and, when the request
uses classifier-free guidance, the negative prompt) tokenized as the model's pipeline tokenizes them,
and, for models that take one, the input image resized to the clip's size as uint8 pixels (the VAE
encode step normalises them). Which guidance values switch the negative branch on is the model's
rule (`uses_cfg`), so no later step encodes or denoises a branch that is never used. A model family
registers its subclass and says how its frames are cut (`geometry`) and how it tokenizes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from PIL import Image

from triton_omni.media.image import ImageDecodeError, decode_image
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext
from triton_omni.video.request import VideoLimits, VideoRequest, parse_request

REQUEST_INPUTS = (
    TensorSpec("prompt", "TYPE_STRING", (1,)),
    TensorSpec("negative_prompt", "TYPE_STRING", (1,), optional=True),
    TensorSpec("size", "TYPE_STRING", (1,), optional=True),             # "WxH", or width and height
    TensorSpec("width", "TYPE_INT32", (1,), optional=True),
    TensorSpec("height", "TYPE_INT32", (1,), optional=True),
    TensorSpec("num_frames", "TYPE_INT32", (1,), optional=True),        # or seconds (at fps)
    TensorSpec("seconds", "TYPE_FP32", (1,), optional=True),
    TensorSpec("fps", "TYPE_INT32", (1,), optional=True),
    TensorSpec("num_inference_steps", "TYPE_INT32", (1,), optional=True),
    TensorSpec("guidance_scale", "TYPE_FP32", (1,), optional=True),
    TensorSpec("guidance_scale_2", "TYPE_FP32", (1,), optional=True),   # the A14B models' second expert
    TensorSpec("seed", "TYPE_INT64", (1,), optional=True),
    TensorSpec("image", "TYPE_STRING", (1,), optional=True),            # the encoded first frame
)

# What the GPU steps read: settings with defaults filled in (the request fields' names, so the ensemble
# wires the checked values, never the raw ones).
SETTINGS = (
    TensorSpec("width", "TYPE_INT32", (1,)),
    TensorSpec("height", "TYPE_INT32", (1,)),
    TensorSpec("num_frames", "TYPE_INT32", (1,)),
    TensorSpec("fps", "TYPE_INT32", (1,)),
    TensorSpec("num_inference_steps", "TYPE_INT32", (1,)),
    TensorSpec("guidance_scale", "TYPE_FP32", (1,)),
    TensorSpec("guidance_scale_2", "TYPE_FP32", (1,)),
    TensorSpec("seed", "TYPE_INT64", (1,)),
)
TEXT = (
    TensorSpec("text_ids", "TYPE_INT32", (-1, -1)),     # [1 or 2, max_sequence_length]: prompt, negative
    TensorSpec("text_mask", "TYPE_INT32", (-1, -1)),
)
FIRST_FRAME = TensorSpec("first_frame", "TYPE_UINT8", (-1, -1, 3))    # [H, W, 3]; [0, 0, 3]: no image


def settings_tensors(r: VideoRequest) -> dict:
    return {"width": np.array([r.width], np.int32), "height": np.array([r.height], np.int32),
            "num_frames": np.array([r.num_frames], np.int32), "fps": np.array([r.fps], np.int32),
            "num_inference_steps": np.array([r.num_inference_steps], np.int32),
            "guidance_scale": np.array([r.guidance_scale], np.float32),
            "guidance_scale_2": np.array([r.guidance_scale_2], np.float32), "seed": np.array([r.seed], np.int64)}


@dataclass
class VideoPreParams(VideoLimits):
    checkpoint: str = ""
    max_sequence_length: int = 512     # tokens a prompt is padded (and cut) to, as the pipelines do


class VideoPre(Step):
    inputs = REQUEST_INPUTS
    outputs = (*TEXT, *SETTINGS)       # models that take an image add FIRST_FRAME
    Params = VideoPreParams
    image: ClassVar[str] = "none"      # the first frame: "none" (text to video), "optional" or "required"

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.limits = VideoLimits(**{f.name: getattr(self.params, f.name) for f in dataclasses.fields(VideoLimits)})
        self.multiple, self.temporal, self.experts = self.geometry()

    # -- what a model says ----------------------------------------------------------------------
    def geometry(self) -> tuple[int, int, int]:
        """(pixels a frame side is a multiple of, frames per VAE group after the first, experts)."""
        raise NotImplementedError

    def uses_cfg(self, guidance_scale: float) -> bool:
        raise NotImplementedError

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """[rows, max_sequence_length] ids and attention mask (int32)."""
        raise NotImplementedError

    def prompts(self, r: VideoRequest) -> list[str]:
        """The texts to tokenize: the prompt, and the negative prompt when the request uses CFG (a model
        whose pipeline writes the clip's settings into them says so here)."""
        return [r.prompt, r.negative_prompt] if self.uses_cfg(r.guidance_scale) else [r.prompt]

    # -- shared ---------------------------------------------------------------------------------
    def first_frame(self, r: VideoRequest) -> np.ndarray:
        """The input image, RGB, resized to the clip's size with Lanczos (as the pipelines' image
        processor resizes a PIL image); [0, 0, 3] when the request has none."""
        if r.image is None:
            if self.image == "required":
                raise InvalidInput("image", "is required: this model generates a video from a first frame")
            return np.zeros((0, 0, 3), np.uint8)
        if self.image == "none":
            raise InvalidInput("image", "this model generates from text alone; it takes no image")
        try:
            image = decode_image(r.image, self.params.max_image_pixels)
        except ImageDecodeError as e:
            raise InvalidInput("image", str(e)) from None
        return np.asarray(image.resize((r.width, r.height), resample=Image.LANCZOS), dtype=np.uint8)

    def one(self, req: Request) -> dict:
        r = parse_request(req, self.multiple, self.temporal, self.limits, self.experts)
        frame = self.first_frame(r)
        ids, mask = self.tokenize(self.prompts(r))
        out = {"text_ids": ids, "text_mask": mask, **settings_tensors(r)}
        if self.image != "none":
            out["first_frame"] = frame
        return out
