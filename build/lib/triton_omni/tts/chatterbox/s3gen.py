"""Chatterbox's S3Gen, decode side: speech tokens -> 80-bin mel (flow) -> 24 kHz waveform (HiFT vocoder),
under the parameter names of s3gen.safetensors (the package's S3Token2Wav; its S3 tokenizer and x-vector
encoder, which only a cloned voice needs, are not built here).

flow (CausalMaskedDiffWithXvec, inference):
- the voice's prompt tokens, then the new tokens, are embedded and run through the upsampling conformer:
  linear in, a pre-lookahead conv, conformer layers with relative-position attention, x2 nearest upsampling
  + conv (two mel frames per token), more conformer layers, encoder_proj to 80 -> `mu`.
- conditional flow matching, 10 Euler steps on a cosine time schedule from Gaussian noise: the estimator
  (a 1-D U-Net of causal resnet blocks and transformer blocks, time embedding, inputs x | mu | speaker |
  prompt mel) runs on a conditional and an unconditional row (mu, speaker and prompt mel zeroed); the step
  is (1 + 0.7) * cond - 0.7 * uncond. The prompt's mel frames are then cut off.
HiFT: an F0 predictor, a harmonic sine source (random initial phases and noise), the source's STFT fed into
an upsampling HiFi-GAN with Snake resblocks, magnitude / phase out, inverse STFT; the first 20 ms muted,
the next 20 ms faded in.

The only randomness is the flow's noise and the sine source's phases and noise; they come from the
request's generator in the package's order, so after torch.manual_seed(seed) the package draws the same.
The sizes the package fixes in code are the defaults of `S3GenConfig`; config.json's `s3gen` overrides
the arguments it passes to each part (the tiny test checkpoint's).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from triton_omni.tts.chatterbox.t3 import read_config

SAMPLE_RATE = 24000
MELS = 80
TOKEN_MEL_RATIO = 2
CFM_STEPS = 10
CFG_RATE = 0.7                          # inference_cfg_rate

RELEASE_ENCODER = dict(output_size=512, attention_heads=8, linear_units=2048, num_blocks=6)
RELEASE_DECODER = dict(channels=[256], attention_head_dim=64, n_blocks=4, num_mid_blocks=12, num_heads=8)
RELEASE_HIFT = dict(base_channels=512, nb_harmonics=8, upsample_rates=[8, 5, 3], upsample_kernel_sizes=[16, 11, 7],
                    istft_params={"n_fft": 16, "hop_len": 4}, resblock_kernel_sizes=[3, 7, 11],
                    resblock_dilation_sizes=[[1, 3, 5]] * 3, source_resblock_kernel_sizes=[7, 7, 11],
                    source_resblock_dilation_sizes=[[1, 3, 5]] * 3)
RELEASE_F0 = dict(cond_channels=512)


# -- the upsampling conformer encoder ---------------------------------------------------------------

def relative_positions(length: int, dim: int, device, dtype) -> torch.Tensor:
    """[1, 2L-1, dim] sinusoids of the relative positions L-1 ... -(L-1) (ESPnet's rel. encoding)."""
    rel = torch.arange(length - 1, -length, -1, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))
    pe = torch.zeros(2 * length - 1, dim)
    pe[:, 0::2] = torch.sin(rel * freq)
    pe[:, 1::2] = torch.cos(rel * freq)
    return pe.unsqueeze(0).to(device=device, dtype=dtype)


class RelPositionAttention(nn.Module):
    """Transformer-XL style attention: content term (q + u)k and position term (q + v)p, p the projected
    relative-position sinusoids, re-indexed so that query i meets key j at relative position i - j."""

    def __init__(self, heads: int, dim: int):
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.linear_q, self.linear_k, self.linear_v, self.linear_out = (nn.Linear(dim, dim) for _ in range(4))
        self.linear_pos = nn.Linear(dim, dim, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.d))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.d))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        heads = lambda y: y.view(y.shape[0], -1, self.h, self.d)  # noqa: E731  [B, T, h, d]
        q, k, v = heads(self.linear_q(x)), heads(self.linear_k(x)), heads(self.linear_v(x))
        p = heads(self.linear_pos(pos)).transpose(1, 2)                    # [1, h, 2T-1, d]
        content = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(1, 2).transpose(-2, -1))
        by_pos = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))    # [B, h, T, 2T-1]
        i = torch.arange(t, device=x.device)
        index = (t - 1 - i[:, None] + i[None, :]).expand(b, self.h, t, t)   # column of relative position i - j
        scores = (content + by_pos.gather(-1, index)) / math.sqrt(self.d)
        out = torch.matmul(scores.softmax(dim=-1), v.transpose(1, 2))
        return self.linear_out(out.transpose(1, 2).reshape(b, t, self.h * self.d))


class ConformerLayer(nn.Module):
    """Pre-norm: attention, then a SiLU feed-forward (no macaron, no convolution module)."""

    def __init__(self, dim: int, heads: int, units: int):
        super().__init__()
        self.self_attn = RelPositionAttention(heads, dim)
        self.feed_forward = nn.Module()
        self.feed_forward.w_1, self.feed_forward.w_2 = nn.Linear(dim, units), nn.Linear(units, dim)
        self.norm_ff, self.norm_mha = nn.LayerNorm(dim, eps=1e-12), nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), pos)
        ff = self.feed_forward
        return x + ff.w_2(F.silu(ff.w_1(self.norm_ff(x))))


class LinearIn(nn.Module):
    """Linear + LayerNorm, then scaled by sqrt(dim) for the positional encoding."""

    def __init__(self, dim_in: int, dim: int):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(dim_in, dim), nn.LayerNorm(dim, eps=1e-5))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.out(x) * math.sqrt(x.shape[-1])
        return x, relative_positions(x.shape[1], x.shape[-1], x.device, x.dtype)


class PreLookahead(nn.Module):
    """A residual conv that sees `lookahead` tokens ahead, then a causal conv of 3."""

    def __init__(self, dim: int, lookahead: int = 3):
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(dim, dim, lookahead + 1)
        self.conv2 = nn.Conv1d(dim, dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.leaky_relu(self.conv1(F.pad(x.transpose(1, 2), (0, self.lookahead))))
        return x + self.conv2(F.pad(y, (2, 0))).transpose(1, 2)


class Upsample2(nn.Module):
    def __init__(self, dim: int, stride: int = 2):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(dim, dim, 2 * stride + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:        # [B, C, T] -> [B, C, 2T]
        x = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(x, (2 * self.stride, 0)))


class UpsampleEncoder(nn.Module):
    def __init__(self, output_size: int, attention_heads: int, linear_units: int, num_blocks: int,
                 up_blocks: int = 4, **_):
        super().__init__()
        d = output_size
        self.embed, self.up_embed = LinearIn(d, d), LinearIn(d, d)
        self.pre_lookahead_layer = PreLookahead(d)
        self.encoders = nn.ModuleList([ConformerLayer(d, attention_heads, linear_units) for _ in range(num_blocks)])
        self.up_layer = Upsample2(d)
        self.up_encoders = nn.ModuleList([ConformerLayer(d, attention_heads, linear_units)
                                          for _ in range(up_blocks)])
        self.after_norm = nn.LayerNorm(d, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, pos = self.embed(x)
        x = self.pre_lookahead_layer(x)
        for layer in self.encoders:
            x = layer(x, pos)
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        x, pos = self.up_embed(x)
        for layer in self.up_encoders:
            x = layer(x, pos)
        return self.after_norm(x)


# -- the flow-matching estimator (1-D U-Net) -----------------------------------------------------------

class CausalConv(nn.Conv1d):
    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__(cin, cout, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class _ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of [B, C, T]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class CausalBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        # indices 1 and 3 of the package's Sequential are its transposes (no parameters)
        self.block = nn.ModuleDict({"0": CausalConv(cin, cout, 3), "2": _ChannelNorm(cout)})

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.mish(self.block["2"](self.block["0"](x * mask))) * mask


class CausalResnet(nn.Module):
    def __init__(self, cin: int, cout: int, time_dim: int):
        super().__init__()
        self.mlp = nn.ModuleDict({"1": nn.Linear(time_dim, cout)})
        self.block1, self.block2 = CausalBlock(cin, cout), CausalBlock(cout, cout)
        self.res_conv = nn.Conv1d(cin, cout, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.block1(x, mask) + self.mlp["1"](F.mish(t)).unsqueeze(-1)
        return self.block2(h, mask) + self.res_conv(x * mask)


class TransformerBlock(nn.Module):
    """Self-attention and a GELU feed-forward, both pre-norm (diffusers' BasicTransformerBlock as used)."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.norm1, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn1 = nn.Module()
        self.attn1.to_q, self.attn1.to_k, self.attn1.to_v = (nn.Linear(dim, inner, bias=False) for _ in range(3))
        self.attn1.to_out = nn.ModuleList([nn.Linear(inner, dim)])
        self.ff = nn.Module()
        self.ff.net = nn.ModuleDict({"0": nn.Module(), "2": nn.Linear(4 * dim, dim)})
        self.ff.net["0"].proj = nn.Linear(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # [B, T, C]; every position valid
        b, t, _ = x.shape
        a, h = self.attn1, self.norm1(x)
        split = lambda y: y.view(b, t, self.heads, -1).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(split(a.to_q(h)), split(a.to_k(h)), split(a.to_v(h)))
        x = x + a.to_out[0](out.transpose(1, 2).reshape(b, t, -1))
        net = self.ff.net
        return x + net["2"](F.gelu(net["0"].proj(self.norm3(x))))


class Estimator(nn.Module):
    """The package's ConditionalDecoder with one channel level (as the release): down, mid and up stages
    of (causal resnet, transformer blocks), a skip connection around the middle."""

    def __init__(self, channels: list[int], attention_head_dim: int, n_blocks: int, num_mid_blocks: int,
                 num_heads: int, in_channels: int = 4 * MELS, out_channels: int = MELS, **_):
        super().__init__()
        if len(channels) != 1:
            raise ValueError("only a one-level estimator (channels=[C], as the release) is supported")
        c, time_dim = channels[0], channels[0] * 4
        self.in_channels = in_channels
        self.time_mlp = nn.Module()
        self.time_mlp.linear_1, self.time_mlp.linear_2 = nn.Linear(in_channels, time_dim), nn.Linear(time_dim, time_dim)

        def stage(cin, last=None):
            blocks = nn.ModuleList([TransformerBlock(c, num_heads, attention_head_dim) for _ in range(n_blocks)])
            return nn.ModuleList([CausalResnet(cin, c, time_dim), blocks] + ([last] if last else []))

        self.down_blocks = nn.ModuleList([stage(in_channels, CausalConv(c, c, 3))])
        self.mid_blocks = nn.ModuleList([stage(c) for _ in range(num_mid_blocks)])
        self.up_blocks = nn.ModuleList([stage(2 * c, CausalConv(c, c, 3))])
        self.final_block = CausalBlock(c, c)
        self.final_proj = nn.Conv1d(c, out_channels, 1)

    def time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        half = self.in_channels // 2
        freq = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
        angle = 1000 * t.unsqueeze(1) * freq.unsqueeze(0)
        emb = torch.cat([angle.sin(), angle.cos()], dim=-1).to(t.dtype)
        return self.time_mlp.linear_2(F.silu(self.time_mlp.linear_1(emb)))

    @staticmethod
    def _stage(stage, x, mask, t):
        x = stage[0](x, mask, t).transpose(1, 2)
        for block in stage[1]:
            x = block(x)
        return x.transpose(1, 2)

    def forward(self, x, mask, mu, t, spks, cond) -> torch.Tensor:
        t = self.time_embedding(t)
        x = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.shape[-1]), cond], dim=1)
        down = self.down_blocks[0]
        skip = self._stage(down, x, mask, t)
        x = down[2](skip * mask)
        for stage in self.mid_blocks:
            x = self._stage(stage, x, mask, t)
        up = self.up_blocks[0]
        x = self._stage(up, torch.cat([x[:, :, :skip.shape[-1]], skip], dim=1), mask, t)
        x = up[2](x * mask)
        x = self.final_block(x, mask)
        return self.final_proj(x * mask) * mask


class Flow(nn.Module):
    def __init__(self, encoder: dict, decoder: dict, vocab: int = 6561, spk_embed_dim: int = 192):
        super().__init__()
        d = encoder["output_size"]
        self.input_embedding = nn.Embedding(vocab, d)
        self.spk_embed_affine_layer = nn.Linear(spk_embed_dim, MELS)
        self.encoder = UpsampleEncoder(**encoder)
        self.encoder_proj = nn.Linear(d, MELS)
        self.decoder = nn.Module()
        self.decoder.estimator = Estimator(**decoder)

    def forward(self, tokens: torch.Tensor, ref: dict, gen: torch.Generator, steps: int = CFM_STEPS) -> torch.Tensor:
        """tokens [1, T] -> mel [1, 80, 2T] (the voice's prompt mel not included)."""
        w = self.encoder_proj.weight
        speaker = self.spk_embed_affine_layer(F.normalize(ref["embedding"].to(w.device, w.dtype).view(1, -1), dim=1))
        prompt_mel = ref["prompt_feat"].to(w.device, w.dtype)                        # [1, frames, 80]
        ids = torch.cat([ref["prompt_token"].to(w.device).view(1, -1), tokens.view(1, -1)], dim=1).long()
        mu = self.encoder_proj(self.encoder(self.input_embedding(ids))).transpose(1, 2)     # [1, 80, 2(P+T)]
        frames = mu.shape[-1]
        cond = torch.zeros_like(mu)
        cond[:, :, :prompt_mel.shape[1]] = prompt_mel.transpose(1, 2)
        x = torch.randn(mu.shape, generator=gen, dtype=mu.dtype).to(w.device)
        mask = torch.ones(2, 1, frames, device=w.device, dtype=w.dtype)
        zero = torch.zeros_like(mu)
        mu2, spk2, cond2 = torch.cat([mu, zero]), torch.cat([speaker, torch.zeros_like(speaker)]), torch.cat([cond, zero])
        t_span = torch.linspace(0, 1, steps + 1, device=w.device, dtype=w.dtype)
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
        estimator = self.decoder.estimator
        for t, r in zip(t_span[:-1], t_span[1:]):
            both = estimator(torch.cat([x, x]), mask, mu2, t.expand(2), spk2, cond2)
            velocity = (1.0 + CFG_RATE) * both[:1] - CFG_RATE * both[1:]
            x = x + (r - t) * velocity
        return x[:, :, prompt_mel.shape[1]:]


# -- HiFT vocoder ------------------------------------------------------------------------------------

class Snake(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha) ** 2


def _wn_conv(cin, cout, kernel, dilation=1):
    return weight_norm(nn.Conv1d(cin, cout, kernel, dilation=dilation, padding=(kernel * dilation - dilation) // 2))


class ResBlock(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations: list[int]):
        super().__init__()
        self.convs1 = nn.ModuleList([_wn_conv(channels, channels, kernel, d) for d in dilations])
        self.convs2 = nn.ModuleList([_wn_conv(channels, channels, kernel) for _ in dilations])
        self.activations1 = nn.ModuleList([Snake(channels) for _ in dilations])
        self.activations2 = nn.ModuleList([Snake(channels) for _ in dilations])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + c2(a2(c1(a1(x))))
        return x


class F0Predictor(nn.Module):
    def __init__(self, cond_channels: int, in_channels: int = MELS):
        super().__init__()
        convs = [weight_norm(nn.Conv1d(in_channels if i == 0 else cond_channels, cond_channels, 3, padding=1))
                 for i in range(5)]
        self.condnet = nn.ModuleDict({str(2 * i): c for i, c in enumerate(convs)})     # ELUs between
        self.classifier = nn.Linear(cond_channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:     # [B, 80, T] -> Hz [B, T]
        x = mel
        for conv in self.condnet.values():
            x = F.elu(conv(x))
        return self.classifier(x.transpose(1, 2)).squeeze(-1).abs()


class HiFT(nn.Module):
    def __init__(self, hift: dict, f0: dict):
        super().__init__()
        p = {**RELEASE_HIFT, **hift}
        base, rates, self.harmonics = p["base_channels"], p["upsample_rates"], p["nb_harmonics"]
        self.n_fft, self.hop = p["istft_params"]["n_fft"], p["istft_params"]["hop_len"]
        self.upsample = int(np.prod(rates)) * self.hop
        self.num_kernels = len(p["resblock_kernel_sizes"])
        self.m_source = nn.Module()
        self.m_source.l_linear = nn.Linear(self.harmonics + 1, 1)
        self.conv_pre = weight_norm(nn.Conv1d(MELS, base, 7, padding=3))
        self.ups = nn.ModuleList([weight_norm(nn.ConvTranspose1d(base // 2 ** i, base // 2 ** (i + 1), k, u,
                                                                 padding=(k - u) // 2))
                                  for i, (u, k) in enumerate(zip(rates, p["upsample_kernel_sizes"]))])
        down = np.cumprod([1] + rates[::-1][:-1])[::-1]
        self.source_downs, self.source_resblocks = nn.ModuleList(), nn.ModuleList()
        for i, (u, k, d) in enumerate(zip(down, p["source_resblock_kernel_sizes"], p["source_resblock_dilation_sizes"])):
            ch = base // 2 ** (i + 1)
            u = int(u)
            self.source_downs.append(nn.Conv1d(self.n_fft + 2, ch, 1) if u == 1 else
                                     nn.Conv1d(self.n_fft + 2, ch, 2 * u, u, padding=u // 2))
            self.source_resblocks.append(ResBlock(ch, k, d))
        self.resblocks = nn.ModuleList([ResBlock(base // 2 ** (i + 1), k, d) for i in range(len(rates))
                                        for k, d in zip(p["resblock_kernel_sizes"], p["resblock_dilation_sizes"])])
        self.conv_post = weight_norm(nn.Conv1d(base // 2 ** len(rates), self.n_fft + 2, 7, padding=3))
        self.f0_predictor = F0Predictor(**{**RELEASE_F0, **f0})
        self.register_buffer("window", torch.hann_window(self.n_fft, periodic=True), persistent=False)

    def source(self, f0: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Harmonic sine source [B, 1, samples] from F0 per mel frame (SineGen + SourceModuleHnNSF): random
        initial phases for the overtones, noise everywhere, sines only where voiced (F0 > 10 Hz)."""
        f0 = f0[:, None].repeat_interleave(self.upsample, dim=-1)                 # nearest upsampling
        b, n = f0.shape[0], self.harmonics + 1
        mult = torch.arange(1, n + 1, device=f0.device, dtype=torch.float32).view(1, n, 1)
        theta = 2 * np.pi * (torch.cumsum(f0 * mult / SAMPLE_RATE, dim=-1) % 1)
        phase = -np.pi + torch.rand((b, n, 1), generator=gen) * (2 * np.pi)
        phase[:, 0] = 0
        sines = 0.1 * torch.sin(theta + phase.to(f0.device))
        voiced = (f0 > 10).float()
        noise = (voiced * 0.003 + (1 - voiced) * 0.1 / 3) * torch.randn(sines.shape, generator=gen).to(f0.device)
        sines = sines * voiced + noise
        return torch.tanh(self.m_source.l_linear(sines.transpose(1, 2))).transpose(1, 2)

    def forward(self, mel: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """mel [B, 80, T] -> waveform [B, T * 480], clipped to +-0.99."""
        s = self.source(self.f0_predictor(mel), gen).squeeze(1)
        spec = torch.view_as_real(torch.stft(s, self.n_fft, self.hop, self.n_fft, window=self.window,
                                             return_complex=True))
        s_spec = torch.cat([spec[..., 0], spec[..., 1]], dim=1)
        x = self.conv_pre(mel)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, 0.1))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_spec))
            blocks = self.resblocks[i * self.num_kernels:(i + 1) * self.num_kernels]
            total = blocks[0](x)
            for block in blocks[1:]:
                total = total + block(x)
            x = total / self.num_kernels
        x = self.conv_post(F.leaky_relu(x))
        half = self.n_fft // 2 + 1
        magnitude, phase = torch.exp(x[:, :half]).clip(max=1e2), torch.sin(x[:, half:])
        wave = torch.istft(torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase)), self.n_fft,
                           self.hop, self.n_fft, window=self.window)
        return wave.clamp(-0.99, 0.99)


def trim_fade(device=None) -> torch.Tensor:
    """Muted 20 ms, then a 20 ms raised-cosine fade in: the package's cure for spill-over from the prompt."""
    n = SAMPLE_RATE // 50
    fade = torch.zeros(2 * n, device=device)
    fade[n:] = (torch.cos(torch.linspace(torch.pi, 0, n, device=device)) + 1) / 2
    return fade


class S3Gen(nn.Module):
    def __init__(self, config: dict | None = None):
        super().__init__()
        config = config or {}
        encoder = {**RELEASE_ENCODER, **config.get("encoder", {})}
        decoder = {**RELEASE_DECODER, **config.get("decoder", {})}
        self.flow = Flow(encoder, decoder)
        self.mel2wav = HiFT(config.get("hift", {}), config.get("f0_predictor", {}))

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "S3Gen":
        from safetensors.torch import load_file

        folder = Path(folder)
        model = cls(read_config(folder).get("s3gen"))
        state = load_file(str(folder / "s3gen.safetensors"))
        ours = model.state_dict()
        missing = sorted(set(ours) - set(state))
        if missing:
            raise ValueError(f"{folder}: s3gen weights missing: {missing[:5]}")
        # the file also holds the S3 tokenizer and the x-vector encoder (voice cloning only)
        model.load_state_dict({k: state[k] for k in ours})
        for m in model.modules():          # weight norm folded once (the same weights, not recomputed per call)
            if parametrize.is_parametrized(m, "weight"):
                parametrize.remove_parametrizations(m, "weight")
        return model.to(device=device, dtype=dtype).eval()

    @torch.inference_mode()
    def mel(self, tokens: torch.Tensor, ref: dict, gen: torch.Generator, steps: int = CFM_STEPS) -> torch.Tensor:
        return self.flow(tokens, ref, gen, steps)

    @torch.inference_mode()
    def waveform(self, mel: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        wave = self.mel2wav(mel.float(), gen)
        fade = trim_fade(wave.device)
        n = min(len(fade), wave.shape[-1])
        wave[:, :n] *= fade[:n]
        return wave

    def synthesize(self, tokens: torch.Tensor, ref: dict, seed: int, steps: int = CFM_STEPS) -> torch.Tensor:
        """tokens [T] -> waveform [T * 960] (float32, CPU): noise from a generator seeded with `seed`."""
        gen = torch.Generator().manual_seed(seed)
        return self.waveform(self.mel(tokens, ref, gen, steps), gen)[0].float().cpu()
