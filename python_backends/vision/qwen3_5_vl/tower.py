"""Qwen3.5's vision tower over packed patches; parameter names are the checkpoint's (`model.visual.*` of
Qwen3_5ForConditionalGeneration, loaded without that prefix).

    uint8 patches -> rescale + normalise (on the device) -> patch embedding (the Conv3d over one
    patch is a matmul) + learned position embedding (bilinearly resampled to each grid) -> ViT blocks
    (LayerNorm, bidirectional attention within each frame with 2-D rotary, GELU MLP) -> merger (LayerNorm,
    2x2 patches concatenated, MLP) -> one embedding per merged patch, as wide as the language model.

Everything that depends on a step's mix of grids (position-embedding taps, rotary positions,
segments) comes in per token (`tower_inputs`, host numpy, cached per grid), so the forward itself has
static shapes for a given token count: vision/packed.py replays it as a CUDA graph per bucket.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.vision.packed import varlen_attention

ACTIVATIONS = {"gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu, "silu": F.silu,
               "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}


class VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, cos, sin, cu, max_seqlen, seg_lens):
        T = x.shape[0]
        q, k, v = self.qkv(x).view(T, 3, self.heads, self.head_dim).unbind(1)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        o = varlen_attention(q, k, v, cu, max_seqlen, self.head_dim ** -0.5, seg_lens)
        return self.proj(o.reshape(T, -1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope over the whole head, in fp32 (as the reference). x [T, H, D], cos/sin [T, D]."""
    xf, c, s = x.float(), cos[:, None], sin[:, None]
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * c + rotated * s).to(x.dtype)


class VisionBlock(nn.Module):
    def __init__(self, dim: int, heads: int, intermediate: int, act: str):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = VisionAttention(dim, heads)
        self.mlp = nn.Module()
        self.mlp.linear_fc1, self.mlp.linear_fc2 = nn.Linear(dim, intermediate), nn.Linear(intermediate, dim)
        self.act = ACTIVATIONS[act]

    def forward(self, x, cos, sin, cu, max_seqlen, seg_lens):
        x = x + self.attn(self.norm1(x), cos, sin, cu, max_seqlen, seg_lens)
        return x + self.mlp.linear_fc2(self.act(self.mlp.linear_fc1(self.norm2(x))))


class PatchMerger(nn.Module):
    def __init__(self, dim: int, merge: int, out_dim: int):
        super().__init__()
        self.width = dim * merge ** 2
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.linear_fc1, self.linear_fc2 = nn.Linear(self.width, self.width), nn.Linear(self.width, out_dim)

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(self.norm(x).view(-1, self.width))))


class Qwen3_5VisionTower(nn.Module):
    # load_weights: the tower inside a Qwen3_5ForConditionalGeneration checkpoint
    rename = {"model.visual.": ""}
    skip_prefixes = ("model.language_model.", "lm_head.", "mtp.")

    def __init__(self, config, image_mean, image_std):
        """`config`: the checkpoint's vision_config; mean/std: the processor's, per channel."""
        super().__init__()
        self.config = config
        dim, self.merge = config.hidden_size, config.spatial_merge_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv3d(config.in_channels, dim, (config.temporal_patch_size, config.patch_size,
                                                                     config.patch_size), bias=True)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, dim)
        self.grid_side = int(config.num_position_embeddings ** 0.5)
        self.blocks = nn.ModuleList(VisionBlock(dim, config.num_heads, config.intermediate_size, config.hidden_act)
                                    for _ in range(config.depth))
        self.merger = PatchMerger(dim, self.merge, config.out_hidden_size)
        head = dim // config.num_heads
        # rotary: head/4 frequencies per spatial axis (height, then width), rotating the whole head
        theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, head // 2, 2, dtype=torch.float32) / (head // 2)),
                             persistent=False)
        # uint8 -> (x / 255 - mean) / std, per value of a patch (channel-major: C, temporal, y, x)
        per = config.temporal_patch_size * config.patch_size ** 2
        std = torch.tensor(image_std, dtype=torch.float32).repeat_interleave(per)
        mean = torch.tensor(image_mean, dtype=torch.float32).repeat_interleave(per)
        self.register_buffer("pixel_scale", 1.0 / (255.0 * std), persistent=False)
        self.register_buffer("pixel_shift", -mean / std, persistent=False)

    @property
    def out_dim(self) -> int:
        return self.config.out_hidden_size

    def forward(self, inputs: dict[str, torch.Tensor], cu: torch.Tensor, max_seqlen: int,
                seg_lens: list[int] | None) -> torch.Tensor:
        """inputs (per patch, packed): pixels [T, patch_bytes] uint8, taps [T, 4] int64, tap_weights [T, 4]
        fp32, hw [T, 2] int64 (rotary positions) -> [T / merge^2, out_dim]."""
        w = self.patch_embed.proj.weight
        x = inputs["pixels"].float() * self.pixel_scale + self.pixel_shift
        x = F.linear(x.to(w.dtype), w.view(w.shape[0], -1), self.patch_embed.proj.bias)
        pe = (self.pos_embed(inputs["taps"]).float() * inputs["tap_weights"][..., None]).sum(1)
        x = x + pe.to(x.dtype)
        freqs = (inputs["hw"][..., None].float() * self.inv_freq).flatten(1)       # [T, head/2]: h freqs, w freqs
        freqs = torch.cat([freqs, freqs], dim=-1)
        cos, sin = freqs.cos(), freqs.sin()
        for block in self.blocks:
            x = block(x, cos, sin, cu, max_seqlen, seg_lens)
        return self.merger(x)


@lru_cache(maxsize=256)
def grid_inputs(h: int, w: int, merge: int, side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One frame's per-patch inputs, in merge-block order: position-embedding taps [h*w, 4] and weights
    (bilinear, corners aligned, from the side x side table), rotary (row, column) [h*w, 2]."""
    r = np.arange(h * w)
    in_col, in_row = r % merge, (r // merge) % merge
    block_col, block_row = (r // merge ** 2) % (w // merge), r // (merge ** 2 * (w // merge))
    row, col = block_row * merge + in_row, block_col * merge + in_col

    def axis(index, size):
        src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
        floor = np.floor(src)
        taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
        weights = np.clip(1 - np.abs(src[:, None] - floor[:, None] - np.arange(2)), 0, None).astype(np.float32)
        return taps, weights

    ht, hw_ = axis(row, h)
    wt, ww = axis(col, w)
    taps = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
    weights = (hw_[:, :, None] * ww[:, None, :]).reshape(-1, 4)
    return taps, weights, np.stack([row, col], axis=1).astype(np.int64)


def tower_inputs(grids: list[tuple[int, int, int]], merge: int, side: int) -> tuple[dict[str, np.ndarray], list[int]]:
    """Per-patch inputs of items of these grids (t, h, w), packed in order, and their attention segments
    (each frame of each item is one segment of h * w patches). `pixels` is left to the caller."""
    parts, segs = [], []
    for t, h, w in grids:
        parts += [grid_inputs(h, w, merge, side)] * t
        segs += [h * w] * t
    if not parts:
        return {"taps": np.zeros((0, 4), np.int64), "tap_weights": np.zeros((0, 4), np.float32),
                "hw": np.zeros((0, 2), np.int64)}, []
    taps, weights, hw = (np.concatenate(x) for x in zip(*parts))
    return {"taps": taps, "tap_weights": weights, "hw": hw}, segs
