"""The SNAC decoder (codes -> waveform), loaded from a release checkpoint folder.

A re-implementation of `snac.SNAC.decode` (hubertsiuzdak/snac) with the same module names, so the
release files load as they are: `config.json` + `pytorch_model.bin`, weight-normed convolutions
stored as `weight_g`/`weight_v` (or the newer `parametrizations.weight.original0/1`). The weight
norm is folded into plain weights at load time, and each codebook's 1x1 output projection into a
lookup table. Two additions serve streaming:

- Noise: each upsampling block adds `noise * linear(x)` with noise from `torch.randn`, so the
  reference never decodes the same codes to the same audio twice. Here the noise is a pluggable
  source: `RandnNoise` reproduces the reference draw for draw (parity tests seed torch), and
  `PositionalNoise` (served) makes the noise a pure function of (seed, block, absolute sample
  position), so a window decoded alone gets exactly the noise it gets inside the whole utterance.
- Windows: the decoder is convolutional (the 24 kHz model has no attention), so an output sample
  depends on a bounded range of latent steps; `receptive_field()` computes that range from the
  layers, and a window with that much context on both sides reproduces the full decode inside it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

# --- noise ---------------------------------------------------------------------------------------
_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 lanes (every product stays below 2^63)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    return (x >> 16) ^ x


def positional_normal(seeds: torch.Tensor, layer: int, positions: torch.Tensor) -> torch.Tensor:
    """Standard normal noise [B, T] as a pure function of (seed [B], layer, position [B, T])
    (two hashed uniforms through Box-Muller)."""
    key = _mix32(_mix32(seeds & _MASK32) ^ ((seeds >> 32) & _MASK32))
    key = _mix32(key ^ ((layer + 1) * 0x27D4EB2F & _MASK32))[:, None]
    h1 = _mix32(key ^ ((positions * 0x9E3779B1) & _MASK32))
    h2 = _mix32(h1 ^ 0x68E31DA4)
    u1 = ((h1 >> 8).double() + 0.5) * (1.0 / (1 << 24))        # uniform in (0, 1)
    u2 = ((h2 >> 8).double() + 0.5) * (1.0 / (1 << 24))
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)).float()


class RandnNoise:
    """The reference's noise: torch.randn at each noise block, in block order."""

    def __call__(self, layer: int, upsample: int, x: torch.Tensor) -> torch.Tensor:
        return torch.randn((x.shape[0], 1, x.shape[-1]), device=x.device, dtype=x.dtype)


class PositionalNoise:
    """Noise fixed by (seed, block, absolute position): `starts` [B] is each row's first latent
    step; a block that upsamples the latent by `upsample` sees positions starts * upsample + t."""

    def __init__(self, seeds: torch.Tensor, starts: torch.Tensor):
        self.seeds, self.starts = seeds.long(), starts.long()

    def __call__(self, layer: int, upsample: int, x: torch.Tensor) -> torch.Tensor:
        t = torch.arange(x.shape[-1], device=x.device, dtype=torch.int64)
        positions = self.starts.to(x.device)[:, None] * upsample + t[None, :]
        return positional_normal(self.seeds.to(x.device), layer, positions).to(x.dtype)[:, None, :]


# --- layers (names as in the snac package) ------------------------------------------------------
class Snake1d(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int, kernel: int = 7):
        super().__init__()
        pad = ((kernel - 1) * dilation) // 2
        self.block = nn.Sequential(
            Snake1d(dim), nn.Conv1d(dim, dim, kernel, dilation=dilation, padding=pad, groups=groups),
            Snake1d(dim), nn.Conv1d(dim, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)       # "same" padding: no crop needed


class NoiseBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Conv1d(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return x + noise * self.linear(x)


class DecoderBlock(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, stride: int, noise: bool, groups: int):
        super().__init__()
        layers = [Snake1d(input_dim),
                  nn.ConvTranspose1d(input_dim, output_dim, 2 * stride, stride=stride, padding=math.ceil(stride / 2),
                                     output_padding=stride % 2)]
        if noise:
            layers.append(NoiseBlock(output_dim))
        layers += [ResidualUnit(output_dim, d, groups) for d in (1, 3, 9)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, noise_fn, layer: int, upsample: int) -> torch.Tensor:
        for m in self.block:
            x = m(x, noise_fn(layer, upsample, x)) if isinstance(m, NoiseBlock) else m(x)
        return x


class Decoder(nn.Module):
    def __init__(self, input_channel: int, channels: int, rates: list[int], noise: bool, depthwise: bool):
        super().__init__()
        if depthwise:
            layers = [nn.Conv1d(input_channel, input_channel, 7, padding=3, groups=input_channel),
                      nn.Conv1d(input_channel, channels, 1)]
        else:
            layers = [nn.Conv1d(input_channel, channels, 7, padding=3)]
        for i, stride in enumerate(rates):
            out_dim = channels // 2 ** (i + 1)
            layers.append(DecoderBlock(channels // 2 ** i, out_dim, stride, noise, out_dim if depthwise else 1))
        layers += [Snake1d(out_dim), nn.Conv1d(out_dim, 1, 7, padding=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, noise_fn) -> torch.Tensor:
        layer, upsample = 0, 1
        for m in self.model:
            if isinstance(m, DecoderBlock):
                upsample *= m.block[1].stride[0]
                x = m(x, noise_fn, layer, upsample)
                layer += 1
            else:
                x = m(x)
        return x


class VectorQuantize(nn.Module):
    """Only what decoding needs: the codebook and its 1x1 output projection."""

    def __init__(self, input_dim: int, codebook_size: int, codebook_dim: int, stride: int):
        super().__init__()
        self.stride = stride
        self.out_proj = nn.Conv1d(codebook_dim, input_dim, 1)
        self.codebook = nn.Embedding(codebook_size, codebook_dim)


class Quantizer(nn.Module):
    def __init__(self, input_dim: int, codebook_size: int, codebook_dim: int, strides: list[int]):
        super().__init__()
        self.quantizers = nn.ModuleList(VectorQuantize(input_dim, codebook_size, codebook_dim, s) for s in strides)


# --- the model -----------------------------------------------------------------------------------
class SNACDecoder(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        if config.get("attn_window_size") is not None:
            raise NotImplementedError("SNAC models with local attention (attn_window_size) are not supported; "
                                      "the 24 kHz model has none")
        self.config = config
        self.sampling_rate = int(config.get("sampling_rate", 24000))
        enc_rates = config.get("encoder_rates", [2, 4, 8, 8])
        latent = config.get("latent_dim") or config.get("encoder_dim", 48) * 2 ** len(enc_rates)
        self.strides = list(config.get("vq_strides", [4, 2, 1]))
        self.codebook_size = int(config.get("codebook_size", 4096))
        self.quantizer = Quantizer(latent, self.codebook_size, config.get("codebook_dim", 8), self.strides)
        rates = list(config.get("decoder_rates", [8, 8, 4, 2]))
        self.decoder = Decoder(latent, config.get("decoder_dim", 1024), rates, config.get("noise", True),
                               config.get("depthwise", True))
        self.hop = math.prod(rates)                    # samples per latent step
        self.frame_steps = max(self.strides)           # latent steps per frame (one coarsest code)
        self.frame_samples = self.hop * self.frame_steps
        self.tables: list[torch.Tensor] = []

    @torch.no_grad()
    def prepare(self) -> None:
        """Fold each codebook's output projection into a [codebook_size, latent] lookup table."""
        self.tables = []
        for q in self.quantizer.quantizers:
            w = q.out_proj.weight[:, :, 0]
            self.tables.append(q.codebook.weight @ w.t() + q.out_proj.bias)

    def latents(self, codes: list[torch.Tensor]) -> torch.Tensor:
        """codes[i]: [B, T / stride_i] int -> z [B, latent, T]."""
        z = 0.0
        for table, c, stride in zip(self.tables, codes, self.strides):
            z = z + table[c.long()].transpose(1, 2).repeat_interleave(stride, dim=-1)
        return z

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], noise=None) -> torch.Tensor:
        """codes[i]: [B, T / stride_i] -> waveform [B, 1, T * hop] (as `SNAC.decode`).
        noise: a source as above; None decodes without noise."""
        if not self.tables:
            self.prepare()
        z = self.latents(codes).to(self.tables[0].dtype)
        return self.decoder(z, noise or (lambda layer, up, x: torch.zeros_like(x[:, :1])))

    def receptive_field(self) -> tuple[int, int]:
        """(left, right): the latent steps before and after step t that the output samples of
        step t depend on, found by walking the decoder's layers backwards."""
        ops = []
        for m in self.decoder.modules():
            if isinstance(m, nn.ConvTranspose1d):
                ops.append(("up", m.stride[0], m.padding[0], m.kernel_size[0]))
            elif isinstance(m, nn.Conv1d):
                ops.append(("conv", m.dilation[0] * (m.kernel_size[0] - 1) // 2))
        t = 1 << 20                       # a step far from both ends: no edge effects
        lo, hi = t * self.hop, (t + 1) * self.hop - 1
        for op in reversed(ops):          # modules() lists them in forward order
            if op[0] == "conv":
                lo, hi = lo - op[1], hi + op[1]
            else:                         # out[j] reads in[i] for 0 <= j + pad - i * stride < kernel
                _, s, p, k = op
                lo, hi = -((k - 1 - lo - p) // s), (hi + p) // s
        return t - lo, hi - t

    def context_frames(self) -> tuple[int, int]:
        """The receptive field in whole frames: (frames of left context, frames of lookahead)."""
        left, right = self.receptive_field()
        return -(-left // self.frame_steps), -(-right // self.frame_steps)


def read_config(folder: str | Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def _folded(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weight-normed parameters (old `weight_g`/`weight_v` or new parametrization names) folded
    into plain `weight`s, exactly as weight_norm computes them (norm over all dims but 0)."""
    out: dict[str, torch.Tensor] = {}
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in state.items():
        for g_suffix, v_suffix in ((".weight_g", ".weight_v"),
                                   (".parametrizations.weight.original0", ".parametrizations.weight.original1")):
            if name.endswith(g_suffix):
                pairs.setdefault(name[:-len(g_suffix)], {})["g"] = t
                break
            if name.endswith(v_suffix):
                pairs.setdefault(name[:-len(v_suffix)], {})["v"] = t
                break
        else:
            out[name] = t
    for prefix, gv in pairs.items():
        if set(gv) != {"g", "v"}:
            raise KeyError(f"{prefix}: weight norm needs both g and v, found {sorted(gv)}")
        out[f"{prefix}.weight"] = torch._weight_norm(gv["v"].float(), gv["g"].float(), 0)
    return out


def load_snac(folder: str | Path, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> SNACDecoder:
    """The decoder from a release folder (config.json + pytorch_model.bin or model.safetensors);
    the encoder and the quantizers' input projections are not needed and skipped."""
    folder = Path(folder)
    model = SNACDecoder(read_config(folder))
    if (folder / "model.safetensors").exists():
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").exists():
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{folder}: no pytorch_model.bin or model.safetensors")
    state = {k: v for k, v in _folded(state).items() if not k.startswith("encoder.") and ".in_proj." not in k}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise KeyError(f"{folder}: SNAC checkpoint does not fit the config: missing {missing[:5]}, "
                       f"unexpected {unexpected[:5]}")
    model = model.to(device=device, dtype=dtype).eval()
    model.prepare()
    return model
