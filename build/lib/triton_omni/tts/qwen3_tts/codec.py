"""The Qwen3-TTS 12 Hz speech tokenizer's decoder: codes [B, T, N] (N = 16 codebooks per 12.5 Hz frame)
-> 24 kHz waveform, 1920 samples per frame. Loaded from the release folder's `speech_tokenizer/`
(config.json, model.safetensors); only `decoder.*` is used (the Mimi-named `encoder.*` turns audio into
codes, for voice cloning, and is skipped).

    quantizer        split RVQ: codebook 0 (rvq_first) + codebooks 1..15 (rvq_rest), each a sum of
                     codebook rows (embedding_sum / cluster_usage) through a 1x1 conv to codebook_dim
    pre_conv         causal conv k3 -> latent_dim
    pre_transformer  input_proj, Qwen-style layers (no q/k norm, LayerScale on both residual branches,
                     causal attention over a sliding window of `sliding_window` frames), norm, output_proj
    upsample         per ratio in upsampling_ratios (2, 2): causal transposed conv + ConvNeXt block
    decoder          causal conv k7 -> decoder_dim; per rate in upsample_rates (8, 5, 4, 3): SnakeBeta,
                     causal transposed conv (k = 2 * rate), residual units (dilation 1, 3, 9); SnakeBeta,
                     causal conv k7 -> 1 channel; clamp to [-1, 1]

Streaming. Every layer is causal: a sample depends on its own frame and earlier ones only (convs pad on
the left, transposed convs trim their right overhang, attention is causal), so there is no lookahead:
frame f's 1920 samples are final as soon as frame f exists. `context_frames()` gives the left
receptive field in frames, rounded up: 581 for the release config, dominated by the transformer
(layers * (sliding_window - 1) = 8 * 71 = 568 frames) plus the convolutions. Two ways to stream:

  - windows (what `python_backends/tts/chunking.ChunkPlan` does for SNAC): decode [s - left, e) and keep
    [s, e). Exact with left = context_frames()[0], but that window is ~580 frames (46 s) per chunk. The
    reference's own `chunked_decode` (300-frame chunks, 25 frames of left context) is the approximate
    version of this: with 25 frames the transformer's context is cut, and its output differs slightly
    from a whole-utterance decode at chunk starts. `decode` here mirrors it exactly (for parity).
  - state (exact and cheap; python_backends/tts/qwen3_tts/codec_stream.py, what the served codec step
    does: python_backends/tts/qwen3_tts/serve.py): keep per request the transformer's last
    `sliding_window - 1` keys/values per layer (rope is relative, so positions can continue) and each
    conv's last (kernel - 1) * dilation input samples (transposed convs: their last input sample); then
    decode only the new frames. The state is a few MB per request at release size.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.models.decoder import PACKED
from triton_omni.models.layers import GatedMLP, MergedLinear, RMSNorm, rope_inv_freq
from triton_omni.models.loader import load_weights

SAMPLE_RATE = 24000


class CausalConv1d(nn.Module):
    """`.conv`, left-padded by (kernel - 1) * dilation (stride 1: the only stride the decoder uses)."""

    def __init__(self, n_in: int, n_out: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(n_in, n_out, kernel, dilation=dilation, groups=groups)
        self.left = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.left, 0)))


class CausalConvTranspose1d(nn.Module):
    """`.conv`, a transposed conv with its right overhang (kernel - stride samples) cut."""

    def __init__(self, n_in: int, n_out: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(n_in, n_out, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., :y.shape[-1] - self.trim] if self.trim else y


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / (e^beta + 1e-9), per channel (alpha, beta stored as logs)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.dwconv(x).transpose(1, 2))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, n_in: int, n_out: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(n_in), CausalConvTranspose1d(n_in, n_out, 2 * rate, rate),
                                    *(ResidualUnit(n_out, d) for d in (1, 3, 9))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.block:
            x = m(x)
        return x


# --- quantizer ------------------------------------------------------------------------------------
class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _RVQLayers(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))


class RVQ(nn.Module):
    """`vq.layers.i._codebook` + `output_proj` (1x1 conv, no bias); `input_proj` (encode side) is skipped."""

    def __init__(self, n: int, size: int, dim: int, out_dim: int):
        super().__init__()
        self.vq = _RVQLayers(n, size, dim)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> [B, out_dim, T]."""
        x = 0
        for k, layer in enumerate(self.vq.layers):
            x = x + F.embedding(codes[:, k], layer._codebook.table())
        return self.output_proj(x.transpose(1, 2))


class SplitRVQ(nn.Module):
    def __init__(self, n_q: int, size: int, dim: int, out_dim: int):
        super().__init__()
        self.rvq_first = RVQ(1, size, dim, out_dim)
        self.rvq_rest = RVQ(n_q - 1, size, dim, out_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


# --- transformer ------------------------------------------------------------------------------------
class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope on [B, H, T, D] with cos/sin [T, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class CodecAttention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = c.get("attention_bias", False)
        self.qkv_proj = MergedLinear(c["hidden_size"], [q, kv, kv], bias=bias)
        self.o_proj = nn.Linear(q, c["hidden_size"], bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (y.view(b, t, -1, self.head_dim).transpose(1, 2)
                   for y in self.qkv_proj(x).split(self.qkv_proj.out_sizes, dim=-1))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim ** -0.5,
                                           enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class CodecLayer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        h = c["hidden_size"]
        self.self_attn = CodecAttention(c)
        self.mlp = GatedMLP(h, c["intermediate_size"])
        self.input_layernorm = RMSNorm(h, c.get("rms_norm_eps", 1e-5))
        self.post_attention_layernorm = RMSNorm(h, c.get("rms_norm_eps", 1e-5))
        self.self_attn_layer_scale = LayerScale(h)
        self.mlp_layer_scale = LayerScale(h)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class CodecTransformer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.window = c.get("sliding_window") or 1 << 30
        self.input_proj = nn.Linear(c["latent_dim"], c["hidden_size"])
        self.layers = nn.ModuleList(CodecLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c.get("rms_norm_eps", 1e-5))
        self.output_proj = nn.Linear(c["hidden_size"], c["latent_dim"])
        head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        cfg = type("RopeConfig", (), {"rope_parameters": {"rope_type": "default",
                                                          "rope_theta": float(c.get("rope_theta", 10000.0))}})
        self.register_buffer("inv_freq", rope_inv_freq(cfg, head)[0], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, latent] -> [B, T, latent]; causal attention over the last `window` frames."""
        t = x.shape[1]
        pos = torch.arange(t, device=x.device)
        freqs = torch.outer(pos.float(), self.inv_freq.float())
        cos, sin = freqs.cos(), freqs.sin()
        d = pos[:, None] - pos[None, :]
        mask = (d >= 0) & (d < self.window)
        x = self.input_proj(x)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output_proj(self.norm(x))


# --- the decoder ----------------------------------------------------------------------------------
class CodecDecoder(nn.Module):
    """`decoder.*` of the speech tokenizer."""

    def __init__(self, c: dict):
        super().__init__()
        self.config = c
        self.num_quantizers = c["num_quantizers"]
        self.quantizer = SplitRVQ(c["num_quantizers"], c["codebook_size"], c["codebook_dim"] // 2, c["codebook_dim"])
        self.pre_conv = CausalConv1d(c["codebook_dim"], c["latent_dim"], 3)
        self.pre_transformer = CodecTransformer(c)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(c["latent_dim"], c["latent_dim"], r, r), ConvNeXtBlock(c["latent_dim"])])
            for r in c["upsampling_ratios"])
        dim = c["decoder_dim"]
        rates = c["upsample_rates"]
        layers = [CausalConv1d(c["latent_dim"], dim, 7)]
        layers += [DecoderBlock(dim // 2 ** i, dim // 2 ** (i + 1), r) for i, r in enumerate(rates)]
        out = dim // 2 ** len(rates)
        layers += [SnakeBeta(out), CausalConv1d(out, 1, 7)]
        self.decoder = nn.ModuleList(layers)
        self.frame_samples = math.prod(rates) * math.prod(c["upsampling_ratios"])

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, N, T] (codebook-major, as the reference's decoder takes them) -> [B, 1, T * 1920]."""
        x = self.pre_conv(self.quantizer.decode(codes))
        x = self.pre_transformer(x.transpose(1, 2)).transpose(1, 2)
        for up, block in self.upsample:
            x = block(up(x))
        for m in self.decoder:
            x = m(x)
        return x.clamp(-1, 1)

    def context_frames(self) -> tuple[int, int]:
        """(left, right): frames of left context that make a window's kept samples exact; no lookahead.
        Each causal layer's reach is converted to frames at its own rate, rounded up in the total."""
        c = self.config
        left = 2.0                                                     # pre_conv k3
        left += len(self.pre_transformer.layers) * (self.pre_transformer.window - 1)
        rate = 1
        for r in c["upsampling_ratios"]:                               # transposed conv k=s: no overlap
            rate *= r
            left += 6 / rate                                           # ConvNeXt dwconv k7
        left += 6 / rate                                               # decoder.0 k7
        for r in c["upsample_rates"]:
            left += 1 / rate                                           # transposed conv k=2s: one input back
            rate *= r
            left += sum(6 * d for d in (1, 3, 9)) / rate               # residual units' k7 convs
        left += 6 / rate                                               # the last conv
        return math.ceil(left) + 1, 0


class Qwen3TTSCodec(nn.Module):
    """The speech tokenizer folder's decoder; `decode` batches utterances of any lengths."""

    packed = PACKED
    skip_prefixes = ("encoder.", "decoder.quantizer.rvq_first.input_proj.", "decoder.quantizer.rvq_rest.input_proj.")

    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        self.decoder = CodecDecoder(config["decoder_config"])
        self.sample_rate = config.get("output_sample_rate", SAMPLE_RATE)
        self.frame_samples = config.get("decode_upsample_rate", self.decoder.frame_samples)
        if self.frame_samples != self.decoder.frame_samples:
            raise ValueError(f"decode_upsample_rate {self.frame_samples} != the decoder's {self.decoder.frame_samples}")

    @property
    def num_quantizers(self) -> int:
        return self.decoder.num_quantizers

    def context_frames(self) -> tuple[int, int]:
        return self.decoder.context_frames()

    @torch.no_grad()
    def decode_window(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, N] -> [B, T * 1920]: one forward over the whole window."""
        return self.decoder(codes.transpose(1, 2).clamp(min=0))[:, 0]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, lengths: torch.Tensor | list[int] | None = None,
               chunk_frames: int = 300, left_context: int = 25) -> list[torch.Tensor]:
        """codes [B, T, N] (rows padded past their `lengths`, or with -1 as the reference pads) ->
        each row's waveform [length * 1920], decoded as the reference's `chunked_decode` does:
        chunks of `chunk_frames`, each with up to `left_context` frames before it, rows batched."""
        b, t, _ = codes.shape
        if lengths is None:
            lengths = (codes[..., 0] > -1).sum(1)
        lengths = [int(n) for n in lengths]
        pieces, start = [], 0
        while start < t:
            end = min(start + chunk_frames, t)
            ctx = min(left_context, start) if start - left_context > 0 else start
            pieces.append(self.decode_window(codes[:, start - ctx:end])[:, ctx * self.frame_samples:])
            start = end
        wave = torch.cat(pieces, dim=-1)
        return [wave[i, :n * self.frame_samples] for i, n in enumerate(lengths)]


def read_codec_config(folder: str | Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def load_codec(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Qwen3TTSCodec:
    """`folder`: the speech tokenizer folder (a release folder's `speech_tokenizer/`, or the release
    folder itself, whose `speech_tokenizer/` is then used)."""
    folder = Path(folder)
    if not (folder / "config.json").exists() or (folder / "speech_tokenizer" / "config.json").exists():
        folder = folder / "speech_tokenizer"
    with torch.device(device):
        model = Qwen3TTSCodec(read_codec_config(folder))
    load_weights(model, folder)
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model.eval()
