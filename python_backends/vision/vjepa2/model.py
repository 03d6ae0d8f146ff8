"""V-JEPA2's video encoder over packed clips; parameter names are the checkpoint's (`encoder.*` of a
VJEPA2Model, `vjepa2.encoder.*` of a VJEPA2ForVideoClassification; the predictor and pooler are not loaded).

    uint8 tubelets (2 frames x 16 x 16 x 3) -> rescale + normalise (device) -> patch embedding (the
    Conv3d over one tubelet is a matmul) -> ViT blocks (LayerNorm, attention with 3-D rotary over
    (frame, row, column), GELU MLP) -> LayerNorm -> one embedding per tubelet.

The rotary is transformers' `VJEPA2RopeAttention`'s: each third of a head (2 * (head_dim // 3 // 2)
dims; the rest unrotated) rotates adjacent pairs by one axis's angle, with the cos/sin table tiled
rather than interleaved. Its tables are computed once per forward (the reference recomputes them in
every layer) and shared by every layer; clips of any frame count pack into one varlen call.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.vision.packed import varlen_attention

ACTIVATIONS = {"gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, bias: bool):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.query, self.key, self.value = (nn.Linear(dim, dim, bias=bias) for _ in range(3))
        self.proj = nn.Linear(dim, dim)
        self.qkv_weight = self.qkv_bias = None      # fused after loading (fuse_qkv)
        self.axis_dim = 2 * ((self.head_dim // 3) // 2)

    def fuse_qkv(self) -> None:
        """One matmul for q, k, v (the checkpoint keeps three): the three become views of the fused weight."""
        for name in ("weight", "bias"):
            parts = [getattr(m, name) for m in (self.query, self.key, self.value)]
            if parts[0] is None:
                continue
            fused = torch.cat([p.detach() for p in parts])
            setattr(self, f"qkv_{name}", fused)
            for p, view in zip(parts, fused.chunk(3)):
                p.data = view

    def forward(self, x, cos, sin, cu, max_seqlen, seg_lens):
        T = x.shape[0]
        q, k, v = F.linear(x, self.qkv_weight, self.qkv_bias).view(T, 3, self.heads, self.head_dim).unbind(1)
        q, k = rotate(q, cos, sin, self.axis_dim), rotate(k, cos, sin, self.axis_dim)
        o = varlen_attention(q, k, v, cu, max_seqlen, self.head_dim ** -0.5, seg_lens)
        return self.proj(o.reshape(T, -1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, axis_dim: int) -> torch.Tensor:
    """x [T, H, D]; cos/sin [T, 3 * axis_dim]: (frame, row, column) thirds, each its axis's tiled table."""
    r = 3 * axis_dim
    head, rest = x[..., :r], x[..., r:]
    pairs = head.unflatten(-1, (-1, 2))
    swapped = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    out = head * cos[:, None].to(x.dtype) + swapped * sin[:, None].to(x.dtype)
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


class Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        dim = config.hidden_size
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=config.layer_norm_eps), nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.attention = Attention(dim, config.num_attention_heads, config.qkv_bias)
        hidden = int(dim * config.mlp_ratio)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, x, cos, sin, cu, max_seqlen, seg_lens):
        x = x + self.attention(self.norm1(x), cos, sin, cu, max_seqlen, seg_lens)
        return x + self.mlp.fc2(self.act(self.mlp.fc1(self.norm2(x))))


class VJEPA2Encoder(nn.Module):
    rename = {"vjepa2.encoder.": "", "encoder.": ""}
    skip_prefixes = ("predictor.", "vjepa2.predictor.", "pooler.", "classifier.")

    def __init__(self, config, image_mean, image_std):
        super().__init__()
        self.config = config
        dim, ps, tub = config.hidden_size, config.patch_size, config.tubelet_size
        self.embeddings = nn.Module()
        self.embeddings.patch_embeddings = nn.Module()
        self.embeddings.patch_embeddings.proj = nn.Conv3d(config.in_chans, dim, (tub, ps, ps), stride=(tub, ps, ps))
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        self.layernorm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.grid = config.crop_size // ps
        axis_dim = self.layer[0].attention.axis_dim if len(self.layer) else 0
        self.register_buffer("omega", 1.0 / 10000 ** (torch.arange(axis_dim // 2, dtype=torch.float32) / (axis_dim / 2)),
                             persistent=False)
        per = tub * ps * ps
        std = torch.tensor(image_std, dtype=torch.float32).repeat_interleave(per)
        mean = torch.tensor(image_mean, dtype=torch.float32).repeat_interleave(per)
        self.register_buffer("pixel_scale", 1.0 / (255.0 * std), persistent=False)
        self.register_buffer("pixel_shift", -mean / std, persistent=False)

    @property
    def tubelet_bytes(self) -> int:
        c = self.config
        return c.in_chans * c.tubelet_size * c.patch_size ** 2

    def forward(self, inputs: dict[str, torch.Tensor], cu: torch.Tensor, max_seqlen: int,
                seg_lens: list[int] | None) -> torch.Tensor:
        """inputs (per tubelet, packed clips): pixels [T, tubelet_bytes] uint8, fhw [T, 3] int64 -> [T, D]."""
        w = self.embeddings.patch_embeddings.proj.weight
        x = inputs["pixels"].float() * self.pixel_scale + self.pixel_shift
        x = F.linear(x.to(w.dtype), w.view(w.shape[0], -1), self.embeddings.patch_embeddings.proj.bias)
        freq = inputs["fhw"][..., None].float() * self.omega                 # [T, 3, axis_dim / 2]
        cos = freq.cos().repeat(1, 1, 2).flatten(1)                           # tiled per axis: [T, 3 * axis_dim]
        sin = freq.sin().repeat(1, 1, 2).flatten(1)
        for layer in self.layer:
            x = layer(x, cos, sin, cu, max_seqlen, seg_lens)
        return self.layernorm(x)


@lru_cache(maxsize=64)
def clip_positions(tubelets: int, grid: int) -> np.ndarray:
    """(frame, row, column) of each token of a clip of `tubelets` x grid x grid tokens [N, 3]."""
    f, r, c = np.meshgrid(np.arange(tubelets), np.arange(grid), np.arange(grid), indexing="ij")
    return np.stack([f.reshape(-1), r.reshape(-1), c.reshape(-1)], axis=1).astype(np.int64)


def tubelets(frames: np.ndarray, tubelet: int, patch: int) -> np.ndarray:
    """frames [T, S, S, 3] uint8 (T a multiple of `tubelet`) -> [T / tubelet * (S / patch)^2, 3 * tubelet * patch^2]
    in the patch embedding's order: tokens (frame, row, column), values (channel, frame, y, x)."""
    T, S, _, C = frames.shape
    g = S // patch
    x = frames.reshape(T // tubelet, tubelet, g, patch, g, patch, C).transpose(0, 2, 4, 6, 1, 3, 5)
    return np.ascontiguousarray(x.reshape(T // tubelet * g * g, C * tubelet * patch * patch))
