"""V-JEPA2 video embeddings: the pre step (decode, sample frames, resize, centre crop, cut tubelets) and
the encoder step (every request's clip in one packed call).

    pre     video (encoded bytes), num_frames -> pixels (uint8 tubelets)
    encode  pixels of every request of the batch -> embedding (the clip's tokens averaged, [D]) and
            patch_embeddings (one per tubelet, [N, D])
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from triton_omni.media.video_decode import VideoDecodeError, VideoLimits, decode_video
from triton_omni.models.loader import load_weights
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register
from triton_omni.vision.packed import PackedStep
from triton_omni.vision.tower_step import PackedTowerStep, TowerJob, TowerParams, to_output
from triton_omni.vision.vjepa2.model import VJEPA2Encoder, clip_positions, tubelets

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ClipLayout:
    crop: int
    resize: int                 # the shorter side before the centre crop (crop * 256 / 224 as released)
    tubelet: int
    patch: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


def load_layout(folder: Path) -> ClipLayout:
    config = json.loads((folder / "config.json").read_text())
    found = [folder / n for n in ("video_preprocessor_config.json", "preprocessor_config.json") if (folder / n).exists()]
    pre = json.loads(found[0].read_text()) if found else {}
    crop = pre.get("crop_size", config.get("crop_size", 256))
    crop = crop["height"] if isinstance(crop, dict) else int(crop)
    resize = (pre.get("size") or {}).get("shortest_edge", int(crop * 256 / 224))
    return ClipLayout(crop, resize, config.get("tubelet_size", 2), config.get("patch_size", 16),
                      tuple(pre.get("image_mean", IMAGENET_MEAN)), tuple(pre.get("image_std", IMAGENET_STD)))


def clip_frames(frames: list[np.ndarray], layout: ClipLayout) -> np.ndarray:
    """Frames [H, W, 3] -> [T, crop, crop, 3] uint8: the shorter side resized to `layout.resize` (Pillow's
    bilinear), then the centre crop; T padded to whole tubelets with the last frame."""
    out = []
    for rgb in frames:
        h, w = rgb.shape[:2]
        short, long = (h, w) if h <= w else (w, h)
        size = (layout.resize, int(layout.resize * long / short))
        nh, nw = size if h <= w else size[::-1]
        img = np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.BILINEAR))
        top, left = int(round((nh - layout.crop) / 2.0)), int(round((nw - layout.crop) / 2.0))
        out.append(img[top:top + layout.crop, left:left + layout.crop])
    out += [out[-1]] * (-len(out) % layout.tubelet)
    return np.stack(out)


@dataclass
class VJEPA2PreParams:
    checkpoint: str = ""
    default_frames: int = 16          # frames sampled uniformly from the clip when a request names none
    max_frames: int = 64
    max_upload_bytes: int = 64 << 20


@register("vjepa2_pre")
class VJEPA2Preprocess(Step):
    inputs = (
        TensorSpec("video", "TYPE_STRING", (1,)),                     # encoded (MP4, WebM, ...)
        TensorSpec("num_frames", "TYPE_INT32", (1,), optional=True),
    )
    outputs = (TensorSpec("pixels", "TYPE_UINT8", (-1, -1)),)
    Params = VJEPA2PreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.layout = load_layout(ctx.checkpoint(self.params.checkpoint))
        self.limits = VideoLimits(max_bytes=self.params.max_upload_bytes)

    def one(self, req: Request) -> dict:
        frames = int(req.scalar("num_frames", self.params.default_frames))
        if not 1 <= frames <= self.params.max_frames:
            raise InvalidInput("num_frames", f"must be in [1, {self.params.max_frames}], got {frames}")
        value = req.get("video").reshape(-1)[0]
        data = value if isinstance(value, bytes) else bytes(value)
        try:
            video = decode_video(data, fps=None, num_frames=frames, limits=self.limits)
        except VideoDecodeError as e:
            raise InvalidInput("video", str(e)) from None
        clip = clip_frames(video.frames, self.layout)
        return {"pixels": tubelets(clip, self.layout.tubelet, self.layout.patch)}


@dataclass
class VJEPA2EncodeParams(TowerParams):
    max_frames: int = 64


def build_encoder(folder: Path) -> VJEPA2Encoder:
    """The encoder of the checkpoint's config, uninitialised (on the current default device)."""
    from transformers import AutoConfig

    layout = load_layout(folder)
    return VJEPA2Encoder(AutoConfig.from_pretrained(str(folder), local_files_only=True), layout.mean, layout.std)


def load_encoder(folder: Path, device, dtype, dummy: bool = False) -> VJEPA2Encoder:
    """The checkpoint's encoder (`dummy`: random weights of its config's shapes, for benchmarks)."""
    with torch.device(device):
        encoder = build_encoder(folder)
    if not dummy:
        load_weights(encoder, folder)
    for p in encoder.parameters():
        p.data = p.data.to(dtype)
        p.requires_grad_(False)
    for layer in encoder.layer:
        layer.attention.fuse_qkv()
    return encoder.eval()


@register("vjepa2_encode")
class VJEPA2Encode(PackedTowerStep):
    inputs = (TensorSpec("pixels", "TYPE_UINT8", (-1, -1), ragged=True),)
    outputs = (TensorSpec("embedding", "TYPE_FP32", (-1,)), TensorSpec("patch_embeddings", "TYPE_FP32", (-1, -1)))
    Params = VJEPA2EncodeParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        self.encoder = load_encoder(folder, ctx.device, torch_dtype(self.params.dtype), self.dummy)
        self.grid, self.tubelet = self.encoder.grid, self.encoder.config.tubelet_size
        self.max_tokens = -(-self.params.max_frames // self.tubelet) * self.grid ** 2
        self.runner = self.make_runner(self.encoder, {"pixels": ((self.encoder.tubelet_bytes,), torch.uint8),
                                                      "fhw": ((3,), torch.int64)})
        self.runner.capture(self.example)

    def example(self, t: int) -> PackedStep:
        per_clip = self.grid ** 2 * max(1, min(t // self.grid ** 2, self.max_tokens // self.grid ** 2))
        n = max(1, t // per_clip)
        pos = clip_positions(per_clip // self.grid ** 2, self.grid)
        return PackedStep({"pixels": np.zeros((n * per_clip, self.encoder.tubelet_bytes), np.uint8),
                           "fhw": np.concatenate([pos] * n)}, [per_clip] * n)

    def input_limits(self) -> dict:
        return {"pixels": (self.max_tokens, None)}

    def job(self, req: Request) -> TowerJob:
        pixels = req.get("pixels")
        pixels = pixels.cpu().numpy() if isinstance(pixels, torch.Tensor) else np.asarray(pixels)
        per_tubelet = self.grid ** 2
        if pixels.ndim != 2 or pixels.shape[1] != self.encoder.tubelet_bytes or not pixels.shape[0] \
                or pixels.shape[0] % per_tubelet:
            raise InvalidInput("pixels", f"shape {list(pixels.shape)}; expected [k * {per_tubelet}, "
                                         f"{self.encoder.tubelet_bytes}] (k tubelets of {self.grid}x{self.grid} patches)")
        n = pixels.shape[0]
        return TowerJob({"pixels": pixels, "fhw": clip_positions(n // per_tubelet, self.grid)}, [n], n)

    def result(self, rows, job: TowerJob) -> dict:
        patches = rows.float()
        return {"embedding": to_output(patches.mean(0)), "patch_embeddings": to_output(patches)}
