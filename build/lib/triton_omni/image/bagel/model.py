"""BAGEL's text-to-image model in plain torch: the Mixture-of-Transformers language model and its
image-generation head, read from a release folder (ByteDance-Seed/BAGEL-7B-MoT layout).

The language model is Qwen2 (q/k/v with bias, rotary positions, SiLU MLP) with q/k RMS norms, and every
layer holds two experts: the understanding weights, which text tokens use, and a `*_moe_gen` twin of each
projection, MLP and norm, which image-latent tokens use. Attention is shared: all tokens of a sequence
attend over one packed sequence whatever expert made their keys.

Text to image, as the release runs it:
  prefill   the prompt, <|im_start|> prompt <|im_end|>, goes through the understanding expert causally at
            positions 0..L-1; only its keys and values are kept (the KV cache).
  per step  one image block, <|vision_start|> latent tokens <|vision_end|>, all at rotary position L (one
            position for the whole image), attends to the cache and to itself (full attention inside the
            block). The two marker tokens take the understanding expert, the latent tokens the generation
            expert; latent token = vae2llm(2x2 patch of latents) + timestep embedding + a fixed 2-D sin-cos
            position of its patch. llm2vae of the final (generation-expert) norm gives the velocity.
  CFG       the unconditional branch is the same block with an empty context (no cache, position 0).

The ViT (image understanding) is not loaded: text to image never runs it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.runtime.params import torch_dtype

FLUX_SCALE, FLUX_SHIFT = 0.3611, 0.1159     # FLUX's latent scale and shift (the release hard-codes them too)
RELEASE_FILES = ("llm_config.json", "ema.safetensors", "ae.safetensors")


def release_folder(folder: Path, who: str) -> Path:
    """A BAGEL release folder, or a clear error naming what is missing."""
    missing = [f for f in RELEASE_FILES if not (folder / f).exists()]
    if missing:
        raise FileNotFoundError(f"{who}: checkpoint folder {str(folder)!r} (parameter 'checkpoint') has no "
                                f"{', '.join(missing)}; build it (`python -m triton_omni.converters tiny`) or pass "
                                "--checkpoint bagel=DIR with a downloaded BAGEL-7B-MoT folder")
    return folder


@dataclass
class BagelConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    qk_norm: bool
    latent_channels: int        # VAE latent channels (16)
    patch: int                  # latent patch side (2): one token per patch
    max_latent_size: int        # patches per side of the latent position table (64 in the release)

    @property
    def patch_dim(self) -> int:
        return self.patch * self.patch * self.latent_channels


def read_config(folder: Path, shapes: dict[str, tuple]) -> BagelConfig:
    """llm_config.json plus what the release's own loader sets in code rather than in a file (q/k norms,
    patch size, latent table size), read from the weights' shapes instead."""
    llm = json.loads((folder / "llm_config.json").read_text())
    heads = llm["num_attention_heads"]
    rope = llm.get("rope_parameters") or {}
    theta = rope.get("rope_theta", llm.get("rope_theta", 10000.0))
    hidden = llm["hidden_size"]
    from safetensors import safe_open

    patch_dim = shapes["vae2llm.weight"][1]
    with safe_open(str(folder / "ae.safetensors"), framework="pt") as ae:     # the autoencoder's latent channels
        latent_channels = int(ae.get_slice("decoder.conv_in.weight").get_shape()[1])
    table = shapes["latent_pos_embed.pos_embed"][0]
    return BagelConfig(hidden_size=hidden, intermediate_size=llm["intermediate_size"],
                       num_layers=llm["num_hidden_layers"], num_heads=heads,
                       num_kv_heads=llm.get("num_key_value_heads", heads),
                       head_dim=llm.get("head_dim") or hidden // heads, rms_norm_eps=llm.get("rms_norm_eps", 1e-6),
                       rope_theta=float(theta),
                       qk_norm="language_model.model.layers.0.self_attn.q_norm.weight" in shapes,
                       latent_channels=latent_channels, patch=math.isqrt(patch_dim // latent_channels),
                       max_latent_size=math.isqrt(table))


# -- building blocks -------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float32, back to the input's dtype before the weight (as Qwen2's norm does).
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class MLP(nn.Module):
    def __init__(self, dim: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, inter, bias=False)
        self.up_proj = nn.Linear(dim, inter, bias=False)
        self.down_proj = nn.Linear(inter, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Expert(nn.Module):
    """One expert's attention projections and q/k norms (the attention itself is shared)."""

    def __init__(self, c: BagelConfig):
        super().__init__()
        self.q = nn.Linear(c.hidden_size, c.num_heads * c.head_dim)
        self.k = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim)
        self.v = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim)
        self.o = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else nn.Identity()
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, T, D] -> q [B, H, T, d], k and v [B, Hkv, T, d] (q and k normed, not yet rotated)."""
        b, t, _ = x.shape
        q = self.q_norm(self.q(x).view(b, t, self.heads, self.head_dim))
        k = self.k_norm(self.k(x).view(b, t, self.kv_heads, self.head_dim))
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


class Layer(nn.Module):
    """A MoT layer: `und` (text) and `gen` (image latents) experts around one shared attention."""

    def __init__(self, c: BagelConfig):
        super().__init__()
        self.und, self.gen = Expert(c), Expert(c)
        self.mlp, self.mlp_gen = MLP(c.hidden_size, c.intermediate_size), MLP(c.hidden_size, c.intermediate_size)
        self.norm_in, self.norm_in_gen = RMSNorm(c.hidden_size, c.rms_norm_eps), RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm_post = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm_post_gen = RMSNorm(c.hidden_size, c.rms_norm_eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, halves layout (Qwen2's rotate_half)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, H, T, d] over k, v [B, Hkv, S, d] (groups of H / Hkv query heads share a kv head);
    mask [B, 1, T or 1, S] bool, True = may attend. Returns [B, T, H * d]."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).flatten(2)


def timestep_features(t: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features of t in [0, 1] (not scaled to 1000): cos then sin, DiT-style frequencies."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


# -- the model ---------------------------------------------------------------------------------------------
class BagelGenerator(nn.Module):
    """The parts of the unified model that text to image runs."""

    def __init__(self, c: BagelConfig, vocab_size: int):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_layers))
        self.norm_gen = RMSNorm(c.hidden_size, c.rms_norm_eps)         # the final norm of latent tokens
        self.time_mlp = nn.Sequential(nn.Linear(256, c.hidden_size), nn.SiLU(), nn.Linear(c.hidden_size, c.hidden_size))
        self.vae2llm = nn.Linear(c.patch_dim, c.hidden_size)
        self.llm2vae = nn.Linear(c.hidden_size, c.patch_dim)
        self.register_buffer("latent_pos", torch.zeros(c.max_latent_size ** 2, c.hidden_size))
        inv = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    # positions -> rotary cos, sin [..., d] in float32, cast like the model's activations
    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[..., None] * self.inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Right-padded prompts [R, L] (mask 1 = real token) through the understanding expert, causally, at
        positions 0..L-1. Returns each layer's rotated keys and values [R, Hkv, L, d]: the context every
        denoise step attends to."""
        x = self.embed_tokens(ids)
        length = ids.shape[1]
        cos, sin = self.rotary(torch.arange(length, device=ids.device), x.dtype)
        causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        allowed = causal[None, None] & mask.bool()[:, None, None, :]
        cache = []
        for i, layer in enumerate(self.layers):
            q, k, v = layer.und.qkv(layer.norm_in(x))
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            cache.append((k, v))
            if i == len(self.layers) - 1:
                break       # the last layer's output only feeds the vocabulary head, which is never used
            x = x + layer.und.o(attend(q, k, v, allowed))
            x = x + layer.mlp(layer.norm_post(x))
        return cache

    @torch.no_grad()
    def marker_embeddings(self, start: int, end: int) -> torch.Tensor:
        """The embeddings of <|vision_start|> and <|vision_end|>, [2, D]."""
        return self.embed_tokens(torch.tensor([start, end], device=self.embed_tokens.weight.device))

    @torch.no_grad()
    def velocity(self, latents: torch.Tensor, t: torch.Tensor, position_ids: torch.Tensor,
                 markers: torch.Tensor, rope_positions: torch.Tensor,
                 cache: list[tuple[torch.Tensor, torch.Tensor]], cache_mask: torch.Tensor) -> torch.Tensor:
        """One model call on a batch of image blocks.

        latents [B, N, patch_dim] (patch tokens, row-major), t [B] in [0, 1], position_ids [N] (latent table
        rows), markers [2, D], rope_positions [B] (each block's one rotary position: its prompt's length, 0
        without context), cache: per layer [B, Hkv, Lc, d] keys and values, cache_mask [B, Lc] bool.
        Returns the velocity [B, N, patch_dim] in float32."""
        dtype = self.vae2llm.weight.dtype
        b, n, _ = latents.shape
        tokens = self.vae2llm(latents.to(dtype)) + self.time_mlp(timestep_features(t).to(dtype))[:, None] \
            + self.latent_pos[position_ids].to(dtype)[None]
        text = markers.to(dtype)[None].expand(b, 2, -1)      # [B, 2, D]: the block's first and last token
        cos, sin = self.rotary(rope_positions[:, None, None], dtype)   # [B, 1, 1, d]: one position per block
        block_mask = torch.ones(b, n + 2, dtype=torch.bool, device=latents.device)
        allowed = torch.cat([cache_mask.bool(), block_mask], dim=1)[:, None, None, :]
        for layer, (past_k, past_v) in zip(self.layers, cache):
            # Each expert projects its own tokens; the block is [start marker, latents, end marker].
            qt, kt, vt = layer.und.qkv(layer.norm_in(text))
            ql, kl, vl = layer.gen.qkv(layer.norm_in_gen(tokens))
            q = torch.cat([qt[:, :, :1], ql, qt[:, :, 1:]], dim=2)
            k = torch.cat([kt[:, :, :1], kl, kt[:, :, 1:]], dim=2)
            v = torch.cat([vt[:, :, :1], vl, vt[:, :, 1:]], dim=2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            out = attend(q, torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2), allowed)
            text = text + layer.und.o(torch.cat([out[:, :1], out[:, -1:]], dim=1))
            tokens = tokens + layer.gen.o(out[:, 1:-1])
            text = text + layer.mlp(layer.norm_post(text))
            tokens = tokens + layer.mlp_gen(layer.norm_post_gen(tokens))
        return self.llm2vae(self.norm_gen(tokens)).float()


def checkpoint_names(c: BagelConfig) -> dict[str, str]:
    """Our parameter name -> its name in the release's ema.safetensors."""
    names = {"embed_tokens.weight": "language_model.model.embed_tokens.weight",
             "norm_gen.weight": "language_model.model.norm_moe_gen.weight",
             "time_mlp.0.weight": "time_embedder.mlp.0.weight", "time_mlp.0.bias": "time_embedder.mlp.0.bias",
             "time_mlp.2.weight": "time_embedder.mlp.2.weight", "time_mlp.2.bias": "time_embedder.mlp.2.bias",
             "vae2llm.weight": "vae2llm.weight", "vae2llm.bias": "vae2llm.bias",
             "llm2vae.weight": "llm2vae.weight", "llm2vae.bias": "llm2vae.bias",
             "latent_pos": "latent_pos_embed.pos_embed"}
    for i in range(c.num_layers):
        src = f"language_model.model.layers.{i}."
        for ours, gen in (("und", ""), ("gen", "_moe_gen")):
            for p in ("q", "k", "v"):
                names[f"layers.{i}.{ours}.{p}.weight"] = f"{src}self_attn.{p}_proj{gen}.weight"
                names[f"layers.{i}.{ours}.{p}.bias"] = f"{src}self_attn.{p}_proj{gen}.bias"
            names[f"layers.{i}.{ours}.o.weight"] = f"{src}self_attn.o_proj{gen}.weight"
            if c.qk_norm:
                names[f"layers.{i}.{ours}.q_norm.weight"] = f"{src}self_attn.q_norm{gen}.weight"
                names[f"layers.{i}.{ours}.k_norm.weight"] = f"{src}self_attn.k_norm{gen}.weight"
        for ours, theirs in (("mlp", "mlp"), ("mlp_gen", "mlp_moe_gen")):
            for p in ("gate_proj", "up_proj", "down_proj"):
                names[f"layers.{i}.{ours}.{p}.weight"] = f"{src}{theirs}.{p}.weight"
        for ours, theirs in (("norm_in", "input_layernorm"), ("norm_in_gen", "input_layernorm_moe_gen"),
                             ("norm_post", "post_attention_layernorm"),
                             ("norm_post_gen", "post_attention_layernorm_moe_gen")):
            names[f"layers.{i}.{ours}.weight"] = f"{src}{theirs}.weight"
    return names


def load_generator(folder: Path, dtype: str = "float32", device: str = "cpu") -> BagelGenerator:
    """The generator from ema.safetensors (only the tensors it uses are read: not the ViT, nor lm_head)."""
    from safetensors import safe_open

    with safe_open(str(folder / "ema.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        config = read_config(folder, shapes)
        names = checkpoint_names(config)
        missing = sorted(v for v in names.values() if v not in shapes)
        if missing:
            raise ValueError(f"{folder / 'ema.safetensors'}: not a BAGEL MoT checkpoint, missing {missing[:4]}...")
        vocab = shapes["language_model.model.embed_tokens.weight"][0]
        with torch.device("meta"):
            model = BagelGenerator(config, vocab)
        state = {ours: f.get_tensor(theirs) for ours, theirs in names.items()}
    # Allocated in the target dtype on the target device, then filled: no float32 copy of a 7B model.
    model = model.to(torch_dtype(dtype)).to_empty(device=device)
    model.load_state_dict(state, strict=True)
    # Recomputed after the meta build: the rotary frequencies stay float32 whatever the weights' dtype.
    model.inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32,
                                                              device=device) / config.head_dim)
    return model.eval()


# -- the autoencoder ---------------------------------------------------------------------------------------
def load_autoencoder(folder: Path, dtype: str = "float32", device: str = "cpu"):
    """FLUX's autoencoder from ae.safetensors (original key names) as diffusers' AutoencoderKL. The release
    hard-codes its shape (128 channels, x1 x2 x4 x4, two res blocks); here it is read from the weights, so
    the tiny checkpoint's smaller autoencoder loads the same way."""
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    from safetensors.torch import load_file

    state = load_file(str(folder / "ae.safetensors"))
    ch = state["encoder.conv_in.weight"].shape[0]
    levels = sorted({int(k.split(".")[2]) for k in state if k.startswith("encoder.down.")})
    mult = [state[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] // ch for i in levels]
    blocks = len({k.split(".")[4] for k in state if k.startswith("encoder.down.0.block.")})
    config = dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * len(mult),
                  up_block_types=["UpDecoderBlock2D"] * len(mult), block_out_channels=[ch * m for m in mult],
                  layers_per_block=blocks, latent_channels=state["decoder.conv_in.weight"].shape[1],
                  norm_num_groups=32, use_quant_conv=False, use_post_quant_conv=False,
                  scaling_factor=FLUX_SCALE, shift_factor=FLUX_SHIFT)
    vae = AutoencoderKL(**config)
    vae.load_state_dict(convert_ldm_vae_checkpoint(state, vae.config), strict=True)
    return vae.to(device=device, dtype=torch_dtype(dtype)).eval()


def schedule(steps: int, shift: float) -> torch.Tensor:
    """The release's timesteps: steps + 1 points linspace(1, 0), shifted t' = s t / (1 + (s - 1) t), in
    float32. Step i goes from t[i] to t[i + 1] (Euler: x -= v (t[i] - t[i + 1]))."""
    t = torch.linspace(1, 0, steps + 1, dtype=torch.float32)
    return shift * t / (1 + (shift - 1) * t)


def unpatchify(tokens: torch.Tensor, h: int, w: int, patch: int, channels: int) -> torch.Tensor:
    """[B, h*w, p*p*C] patch tokens (each patch laid out row, column, channel) -> latents [B, C, h*p, w*p]."""
    b = tokens.shape[0]
    x = tokens.reshape(b, h, w, patch, patch, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(b, channels, h * patch, w * patch)
