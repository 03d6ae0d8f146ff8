"""Qwen3.5 image and video -> text: the pre step (chat template with images and videos, their decoding,
resizing and patches, the prompt's rope positions) and the vision tower step. The language model is
the shared AR step with spliced embeddings (ar/embeds_step.py), the detokenizer the chat models' own.

    pre     messages (+ images / videos bytes) -> input_ids, sampling, pixels (uint8 patches), grid_thw,
            rope_positions
    vision  pixels + grid_thw of every request of the batch -> prompt_embeds (one packed tower call)
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.media.image import ImageDecodeError, decode_pixels
from triton_omni.media.video_decode import VideoDecodeError, VideoLimits, decode_video
from triton_omni.models.loader import load_weights
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, StepContext, register
from triton_omni.text.chat import ChatPreParams, ChatPreprocess
from triton_omni.vision.packed import PackedStep
from triton_omni.vision.chat import MediaInputs, MediaPart, parse_vision_messages
from triton_omni.vision.qwen3_5_vl import processor as proc
from triton_omni.vision.qwen3_5_vl.tower import Qwen3_5VisionTower, tower_inputs
from triton_omni.vision.tower_step import PackedTowerStep, TowerJob, TowerParams, to_output


@dataclass
class VisionLimits:
    """What one request may hand the vision path; every step of it refuses more."""
    max_images: int = 8
    max_videos: int = 2
    max_pixels: int = 1 << 22          # an image resized within this many pixels (and the processor's own budget)
    max_video_pixels: int = 1 << 24    # a video's sampled frames together, resized within this
    max_frames: int = 64               # frames sampled from one video at most


@dataclass
class Qwen3_5VLPreParams(ChatPreParams, VisionLimits):
    max_upload_pixels: int = 4096 * 4096     # an uploaded image larger than this is refused before decoding
    max_upload_bytes: int = 32 << 20         # an image's or a video's encoded bytes at most
    max_messages_bytes: int = 64 << 20       # messages may carry media as data: URLs


def rope_grid_positions(ids: np.ndarray, config: dict, grids: list[tuple[int, int, int]]) -> np.ndarray:
    merge = config["vision_config"].get("spatial_merge_size", 2)
    return proc.rope_positions(ids, config["image_token_id"], config["video_token_id"], grids, merge)


@register("qwen3_5_vl_pre")
class Qwen3_5VLPreprocess(ChatPreprocess):
    inputs = ChatPreprocess.inputs + (
        TensorSpec("images", "TYPE_STRING", (-1,), optional=True, ragged=True),     # encoded images, in order
        TensorSpec("videos", "TYPE_STRING", (-1,), optional=True, ragged=True),     # encoded videos, in order
        # JSON: {"fps": frames sampled a second of video, "max_frames": at most this many}
        TensorSpec("mm_processor_kwargs", "TYPE_STRING", (1,), optional=True),
    )
    outputs = ChatPreprocess.outputs + (
        TensorSpec("pixels", "TYPE_UINT8", (-1, -1)),            # [patches, 3 * temporal * patch^2] of every item
        TensorSpec("grid_thw", "TYPE_INT64", (-1, 3)),           # each item's (t, h, w) patches, in prompt order
        TensorSpec("rope_positions", "TYPE_INT32", (3, -1)),     # each prompt token's (t, h, w) rotary position
    )
    Params = Qwen3_5VLPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        self.layout = proc.load_layout(folder)
        self.config = json.loads((folder / "config.json").read_text())
        self.video_limits = VideoLimits(max_bytes=self.params.max_upload_bytes)

    def input_limits(self) -> dict:
        return {"images": (self.params.max_images,), "videos": (self.params.max_videos,)}

    def prompt_text(self, req: Request, tools) -> str | list[int]:
        """The chat step's prompt, with each image and video decoded, resized and cut into patches
        here (their grids size the placeholders), and the expanded text returned; the patches wait on
        the request (`req.vision`) for `execute`."""
        req.vision = ([], [])
        if req.get("messages") is None:          # a raw prompt: placeholders in it would have no pixels
            prompt = super().prompt_text(req, tools)
            holes = (self.config["image_token_id"], self.config["video_token_id"])
            if isinstance(prompt, str) and (proc.IMAGE_PAD in prompt or proc.VIDEO_PAD in prompt) or \
                    not isinstance(prompt, str) and any(t in holes for t in prompt):
                raise InvalidInput("text_input" if isinstance(prompt, str) else "prompt_token_ids",
                                   "image and video placeholders need messages with media parts")
            return prompt
        self.check_messages_only(req)
        template_messages, media = parse_vision_messages(req.json("messages"),
                                                         MediaInputs(req.get("images"), req.get("videos")))
        p = self.params
        for kind, most in (("image", p.max_images), ("video", p.max_videos)):
            n = sum(m.kind == kind for m in media)
            if n > most:
                raise InvalidInput("messages", f"{n} {kind}s; this model takes at most {most} a request")
        text = self.render_chat(template_messages, req, tools)
        patches, grids, images, videos = self.pixels(media, req)
        req.vision = (patches, grids)
        return proc.expand_prompt(text, images, videos, self.layout.merge_size)

    def video_options(self, req: Request) -> tuple[float, int]:
        opts = req.json("mm_processor_kwargs", {})
        if not isinstance(opts, dict) or set(opts) - {"fps", "max_frames"}:
            raise InvalidInput("mm_processor_kwargs", "expected a JSON object with 'fps' and/or 'max_frames'")
        fps = opts.get("fps", self.layout.fps)
        frames = opts.get("max_frames", self.params.max_frames)
        if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not 0 < fps <= 60:
            raise InvalidInput("mm_processor_kwargs.fps", f"must be a number in (0, 60], got {fps!r}")
        if not isinstance(frames, int) or isinstance(frames, bool) or not 1 <= frames <= self.params.max_frames:
            raise InvalidInput("mm_processor_kwargs.max_frames", f"must be an integer in [1, {self.params.max_frames}]")
        return float(fps), frames

    def pixels(self, media: list[MediaPart], req: Request):
        """Each item's uint8 patches and grid; for the prompt, each image's grid and each video's grid
        and frame timestamps."""
        patches, grids, images, videos = [], [], [], []
        p, layout = self.params, self.layout
        for part in media:
            if len(part.data) > p.max_upload_bytes:
                raise InvalidInput(part.field, f"{len(part.data)} bytes; at most {p.max_upload_bytes} are accepted")
            try:
                if part.kind == "image":
                    x, grid = proc.image_patches(decode_pixels(part.data, p.max_upload_pixels), layout, p.max_pixels)
                    images.append(grid)
                else:
                    fps, most = self.video_options(req)
                    v = decode_video(part.data, fps=fps, min_frames=min(layout.min_frames, most), max_frames=most,
                                     limits=self.video_limits)
                    x, grid = proc.video_patches(v.frames, layout, p.max_video_pixels)
                    videos.append((grid, proc.timestamps(v.indices, v.fps, layout.temporal_patch_size)))
            except (ImageDecodeError, VideoDecodeError, ValueError) as e:
                raise InvalidInput(part.field, str(e)) from None
            patches.append(x)
            grids.append(grid)
        return patches, grids, images, videos

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        """The chat step's outputs, plus each request's patches, grids and rope positions."""
        results = super().execute(requests)
        width = self.layout.patch_bytes
        for i, (req, out) in enumerate(zip(requests, results)):
            if isinstance(out, dict):
                patches, grids = req.vision
                out["pixels"] = np.concatenate(patches) if patches else np.zeros((0, width), np.uint8)
                out["grid_thw"] = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
                try:
                    out["rope_positions"] = rope_grid_positions(out["input_ids"].astype(np.int64), self.config, grids)
                except ValueError as e:     # the template split a placeholder run: not this model's template
                    results[i] = InvalidInput("messages", str(e))
        return results


@dataclass
class Qwen3_5VisionParams(TowerParams, VisionLimits):
    pass


def build_tower(folder) -> Qwen3_5VisionTower:
    """The tower of the checkpoint's config, uninitialised (on the current default device)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    layout = proc.load_layout(folder)
    return Qwen3_5VisionTower(config.vision_config, layout.image_mean, layout.image_std)


def load_tower(folder, device, dtype, dummy: bool = False) -> Qwen3_5VisionTower:
    """The checkpoint's vision tower (`dummy`: random weights of its config's shapes, for benchmarks)."""
    with torch.device(device):
        tower = build_tower(folder)
    if not dummy:
        load_weights(tower, folder)
    for p in tower.parameters():
        p.data = p.data.to(dtype)
        p.requires_grad_(False)
    return tower.eval()


@register("qwen3_5_vl_vision")
class Qwen3_5VisionStep(PackedTowerStep):
    """Every image and video frame of every request in the batch through the tower in one packed call."""
    inputs = (
        TensorSpec("pixels", "TYPE_UINT8", (-1, -1), ragged=True),
        TensorSpec("grid_thw", "TYPE_INT64", (-1, 3), ragged=True),
    )
    outputs = (TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1)),)
    Params = Qwen3_5VisionParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        self.layout = proc.load_layout(folder)
        self.tower = load_tower(folder, ctx.device, torch_dtype(self.params.dtype), self.dummy)
        self.merge, self.side = self.tower.merge, self.tower.grid_side
        p, unit = self.params, self.layout.patch_size ** 2
        # one request's patches at most: its images and its videos' frames, each within its budget
        self.max_patches = (p.max_images * p.max_pixels + p.max_videos * p.max_video_pixels) // unit
        self.runner = self.make_runner(self.tower, {
            "pixels": ((self.layout.patch_bytes,), torch.uint8), "taps": ((4,), torch.int64),
            "tap_weights": ((4,), torch.float32), "hw": ((2,), torch.int64)})
        self.runner.capture(self.example)

    def example(self, t: int):
        """A step of t patches (square frames of merge-aligned sides) for graph capture."""
        side = self.merge * max(1, int((t // self.merge ** 2) ** 0.5))
        n = max(1, t // side ** 2)
        tokens, segs = tower_inputs([(1, side, side)] * n, self.merge, self.side)
        tokens["pixels"] = np.zeros((len(tokens["hw"]), self.layout.patch_bytes), np.uint8)
        return PackedStep(tokens, segs)

    def input_limits(self) -> dict:
        return {"pixels": (self.max_patches, None), "grid_thw": (self.params.max_images + self.params.max_videos * self.params.max_frames, None)}

    def job(self, req: Request) -> TowerJob:
        pixels, grid = req.get("pixels"), req.get("grid_thw")
        pixels = pixels.cpu().numpy() if isinstance(pixels, torch.Tensor) else np.asarray(pixels)
        grid = (grid.cpu().numpy() if isinstance(grid, torch.Tensor) else np.asarray(grid)).reshape(-1, 3)
        if grid.size and (grid.min() < 1 or (grid[:, 1:] % self.merge).any()):
            raise InvalidInput("grid_thw", f"each (t, h, w) must be positive, h and w multiples of {self.merge}")
        n = int(grid.prod(axis=1).sum()) if grid.size else 0
        if pixels.shape != (n, self.layout.patch_bytes):
            raise InvalidInput("pixels", f"shape {list(pixels.shape)}; grid_thw gives [{n}, {self.layout.patch_bytes}]")
        if n > self.max_patches:
            raise InvalidInput("pixels", f"{n} patches; at most {self.max_patches} a request")
        tokens, segs = tower_inputs([tuple(int(v) for v in g) for g in grid], self.merge, self.side)
        tokens["pixels"] = pixels
        return TowerJob(tokens, segs, n // self.merge ** 2)

    def result(self, rows, job: TowerJob) -> dict:
        if rows is None:
            rows = torch.zeros((0, self.tower.out_dim), device=self.ctx.device)
        return {"prompt_embeds": to_output(rows.float())}
