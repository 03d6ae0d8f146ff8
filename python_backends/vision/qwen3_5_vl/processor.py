"""Qwen3.5's vision processor, on the host: sizes, patches, prompt placeholders, multimodal rope positions.

What transformers' Qwen3-VL processor (Qwen2VLImageProcessorPil, Qwen3VLVideoProcessor, Qwen3VLProcessor)
and Qwen3_5Model.get_rope_index do, in numpy, except that pixels stay uint8: the device rescales and
normalises them (normalisation is per channel, so it commutes with cutting patches).

- Images are resized (Pillow, bicubic) so both sides are multiples of patch * merge and the pixel
  count lies in [min_pixels, max_pixels]; cut into patch x patch tiles, each repeated over the
  temporal patch, in the order the tower's 2x2 merge reads them.
- Videos: frames sampled at `fps`, resized together within the video pixel budget, padded to whole
  temporal patches with the last frame; each temporal patch is a grid of its own in the prompt:
  `<t seconds><|vision_start|><|video_pad|>...<|vision_end|>`, its timestamp the mean of its frames'.
- The prompt text from the chat template holds one `<|vision_start|><|image_pad|><|vision_end|>`
  per image (and the same with `<|video_pad|>` per video); each pad becomes one token per merged patch.
- Rope positions [3, L]: text tokens count up on all three axes; a grid of merged patches starting
  at position p takes (p, p + row, p + column); the text after it continues at p + max(rows, columns).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"


@dataclass(frozen=True)
class VisionLayout:
    """The processor settings of a checkpoint (preprocessor_config.json, video_preprocessor_config.json)."""
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    min_pixels: int = 65536
    max_pixels: int = 16777216
    video_min_pixels: int = 4096
    video_max_pixels: int = 25165824
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def patch_bytes(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size ** 2


def _size(config: dict, lo_key: str, hi_key: str) -> tuple[int | None, int | None]:
    size = config.get("size") or {}
    return (size.get("shortest_edge", config.get(lo_key)), size.get("longest_edge", config.get(hi_key)))


def load_layout(folder: str | Path) -> VisionLayout:
    folder, d = Path(folder), VisionLayout()
    image = json.loads((folder / "preprocessor_config.json").read_text())
    video_file = folder / "video_preprocessor_config.json"
    video = json.loads(video_file.read_text()) if video_file.exists() else {}
    lo, hi = _size(image, "min_pixels", "max_pixels")
    vlo, vhi = _size(video, "min_pixels", "max_pixels")
    return VisionLayout(
        patch_size=image.get("patch_size", d.patch_size), temporal_patch_size=image.get("temporal_patch_size", d.temporal_patch_size),
        merge_size=image.get("merge_size", d.merge_size), image_mean=tuple(image.get("image_mean", d.image_mean)),
        image_std=tuple(image.get("image_std", d.image_std)), min_pixels=lo or d.min_pixels, max_pixels=hi or d.max_pixels,
        video_min_pixels=vlo or d.video_min_pixels, video_max_pixels=vhi or d.video_max_pixels,
        fps=video.get("fps", d.fps), min_frames=video.get("min_frames", d.min_frames),
        max_frames=video.get("max_frames", d.max_frames))


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
                 frames: int = 1, temporal: int = 1) -> tuple[int, int]:
    """Sides that are multiples of `factor`, the aspect kept as closely as may be, frames x pixels within
    [min_pixels, max_pixels] (images: frames = temporal = 1; videos count whole temporal patches)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.0f}:1 is above 200:1")
    if temporal > 1 and (height < factor or width < factor):
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal if temporal > 1 else 1
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resize(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """[H, W, 3] uint8 -> [height, width, 3] uint8 (Pillow's bicubic, as the processor)."""
    if rgb.shape[:2] == (height, width):
        return rgb
    return np.asarray(Image.fromarray(rgb).resize((width, height), Image.BICUBIC))


def patchify(frames: np.ndarray, layout: VisionLayout) -> tuple[np.ndarray, tuple[int, int, int]]:
    """frames [T, H, W, 3] uint8 (an image: T = 1) -> patches [t * h * w, 3 * tp * ps * ps] uint8 and the
    grid (t, h, w) in patches, in the merge-block order the tower reads; an image's one frame fills
    every temporal slot, a video's frames are padded with the last to whole temporal patches."""
    tp, ps, m = layout.temporal_patch_size, layout.patch_size, layout.merge_size
    T, H, W, C = frames.shape
    if T == 1:
        frames = np.broadcast_to(frames, (tp, H, W, C))
    elif T % tp:
        frames = np.concatenate([frames, np.repeat(frames[-1:], tp - T % tp, axis=0)])
    gt, gh, gw = frames.shape[0] // tp, H // ps, W // ps
    x = frames.reshape(gt, tp, gh // m, m, ps, gw // m, m, ps, C)
    # -> (t, block row, block col, row in block, col in block, channel, temporal, y, x)
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, C * tp * ps * ps)), (gt, gh, gw)


def image_patches(rgb: np.ndarray, layout: VisionLayout, max_pixels: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    h, w = smart_resize(rgb.shape[0], rgb.shape[1], layout.factor, layout.min_pixels, min(max_pixels, layout.max_pixels))
    return patchify(resize(rgb, h, w)[None], layout)


def video_patches(frames: list[np.ndarray], layout: VisionLayout, max_pixels: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """All of a video's frames resized to one size (the first frame's aspect) within the video budget."""
    h0, w0 = frames[0].shape[:2]
    h, w = smart_resize(h0, w0, layout.factor, layout.video_min_pixels, min(max_pixels, layout.video_max_pixels),
                        frames=len(frames), temporal=layout.temporal_patch_size)
    return patchify(np.stack([resize(f, h, w) for f in frames]), layout)


def timestamps(indices: np.ndarray, video_fps: float, temporal: int) -> list[float]:
    """Each temporal patch's time in seconds: the mean of its first and last frames' (indices padded with
    the last to whole patches)."""
    idx = list(np.asarray(indices).tolist())
    idx += [idx[-1]] * (-len(idx) % temporal)
    t = [i / video_fps for i in idx]
    return [(t[i] + t[i + temporal - 1]) / 2 for i in range(0, len(t), temporal)]


def expand_prompt(text: str, image_grids: list[tuple[int, int, int]], videos: list[tuple[tuple[int, int, int], list[float]]],
                  merge: int) -> str:
    """The template's text with each image pad repeated once per merged patch, and each video's wrapper
    replaced by its frames: a timestamp, then the frame's pads between vision start and end."""
    wrapper = VISION_START + VIDEO_PAD + VISION_END
    out, rest = [], text
    images, vids = iter(image_grids), iter(videos)
    while True:
        i, v = rest.find(IMAGE_PAD), rest.find(wrapper)
        if i < 0 and v < 0:
            break
        if v < 0 or 0 <= i < v:
            t, h, w = next(images)
            out += [rest[:i], IMAGE_PAD * (t * h * w // merge ** 2)]
            rest = rest[i + len(IMAGE_PAD):]
        else:
            (t, h, w), times = next(vids)
            frame = VIDEO_PAD * (h * w // merge ** 2)
            out += [rest[:v]] + [f"<{s:.1f} seconds>{VISION_START}{frame}{VISION_END}" for s in times]
            rest = rest[v + len(wrapper):]
    return "".join(out) + rest


def rope_positions(ids: np.ndarray, image_token: int, video_token: int, grids: list[tuple[int, int, int]],
                   merge: int) -> np.ndarray:
    """[3, L] int32: each token's (time, height, width) rotary position. `grids`: every image's and every
    video's (t, h, w) in prompt order; a video's t frames are t grids of their own in the prompt."""
    frames = iter([(1, h, w) for t, h, w in grids for _ in range(t)])
    is_media = (ids == image_token) | (ids == video_token)
    pos = np.zeros((3, len(ids)), np.int64)
    i, p = 0, 0
    while i < len(ids):
        j = i
        while j < len(ids) and is_media[j] == is_media[i] and (not is_media[i] or ids[j] == ids[i]):
            j += 1
        if not is_media[i]:
            pos[:, i:j] = np.arange(p, p + j - i)
            p += j - i
        else:
            _, h, w = next(frames)
            gh, gw = h // merge, w // merge
            if gh * gw != j - i:
                raise ValueError(f"{j - i} placeholder tokens where a grid of {gh}x{gw} was expected")
            rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
            pos[0, i:j] = p
            pos[1, i:j] = p + rows.reshape(-1)
            pos[2, i:j] = p + cols.reshape(-1)
            p += max(gh, gw)
        i = j
    return pos.astype(np.int32)
