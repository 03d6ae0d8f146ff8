"""What the vision tests share: media made here (real PNG and MP4 files), the Qwen3.5 VL steps in-process
from their YAML, and the reference answer by transformers' Qwen3_5ForConditionalGeneration.generate."""
from __future__ import annotations

import json

import numpy as np
import torch

from triton_omni.converters.schema import load_ensemble
from triton_omni.media.image import encode_image
from triton_omni.media.video_decode import encode_test_video
from triton_omni.runtime.params import parse_params
from triton_omni.runtime.step import Request, StepContext
from tests.conftest import ROOT

# (height, width) of the test images: different grids after resizing, one below the minimum pixels
IMAGE_SIZES = [(70, 100), (48, 48), (120, 60), (20, 30), (96, 128), (64, 40), (33, 90), (100, 100)]
GREEDY = {"max_tokens": 10, "temperature": 0, "ignore_eos": True}


def image(h: int, w: int, seed: int = 0) -> bytes:
    """A PNG of smooth colour gradients with noise (what resizing treats like a photo)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1), 128 + 0 * x], -1)
    return encode_image(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8))


def video(frames: int = 6, h: int = 48, w: int = 64, fps: int = 2, seed: int = 1) -> bytes:
    rng = np.random.default_rng(seed)
    return encode_test_video([rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(frames)], fps=fps)


def user(parts: list[dict] | str) -> list[dict]:
    return [{"role": "user", "content": parts}]


IMAGE_Q = [{"type": "image"}, {"type": "text", "text": "Describe the image."}]
VIDEO_Q = [{"type": "video"}, {"type": "text", "text": "What happens in the video?"}]


def strings(*values) -> np.ndarray:
    return np.array([v if isinstance(v, bytes) else v.encode() for v in values], dtype=object)


def pre_request(messages, images=(), videos=(), sampling=GREEDY) -> Request:
    t = {"messages": strings(json.dumps(messages)), "sampling_parameters": strings(json.dumps(sampling))}
    if images:
        t["images"] = strings(*images)
    if videos:
        t["videos"] = strings(*videos)
    return Request(t)


def load_steps(name: str, keys: list[str]) -> dict:
    """The named steps of an ensemble, built in-process with the YAML's CPU parameters."""
    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{name}.yaml")
    out = {}
    for s in cfg.steps:
        if s.key in keys:
            ctx = StepContext(model_name=cfg.model_name(s), params=parse_params(s.cls.Params, cfg.resolved_parameters(s, "cpu")),
                              device="cpu", base_dir=ROOT, max_batch_size=cfg.max_batch_size)
            out[s.key] = s.cls(ctx)
    return out


def hf_inputs(pre_out: dict, tower, config) -> dict:
    """transformers' inputs for what our pre step made: ids, mm_token_type_ids, pixel values (our uint8
    patches normalised as the processor does) and grids, as images or videos by placeholder."""
    ids = torch.from_numpy(pre_out["input_ids"].astype(np.int64))[None]
    types = ((ids == config.image_token_id).int() + 2 * (ids == config.video_token_id).int())
    kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": types}
    if pre_out["grid_thw"].size:
        pixels = torch.from_numpy(pre_out["pixels"]).float() * tower.pixel_scale + tower.pixel_shift
        grid = torch.from_numpy(pre_out["grid_thw"])
        if (ids == config.video_token_id).any():
            kw.update(pixel_values_videos=pixels, video_grid_thw=grid)
        else:
            kw.update(pixel_values=pixels, image_grid_thw=grid)
    return kw


def hf_greedy(hf, pre_out: dict, tower, n: int = GREEDY["max_tokens"]) -> list[int]:
    kw = hf_inputs(pre_out, tower, hf.config)
    with torch.no_grad():
        # no EOS (ignore_eos): min_new_tokens would instead mask EOS out of the choices
        out = hf.generate(**kw, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, kw["input_ids"].shape[1]:].tolist()
