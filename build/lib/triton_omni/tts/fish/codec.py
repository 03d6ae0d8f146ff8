"""Fish S2-Pro's codec (codec.pth in the release folder; the same "modded DAC" as S1-mini's). The decoder:
codes [B, N, T] -> 44.1 kHz waveform [B, T * frame_samples].

  quantizer   code 0 from the semantic codebook, codes 1..N-1 from the residual ones; each code's
              vector (codebook_dim wide) goes through its own 1x1 conv to the latent width; all summed
  post        a causal transformer over frames, each position attending to the last `window` (128)
              positions (RMSNorm, rope with bfloat16 tables, layer scales)
  upsample    per factor (2, 2): a causal transposed conv (kernel = stride) and a ConvNeXt block
  decoder     DAC's: conv, then per rate a Snake, a causal transposed conv (kernel 2 * rate) and three
              dilated residual units (1, 3, 9), then Snake, conv, tanh

The encoder (voice cloning: a reference clip -> its codes, what the release's DAC.encode returns):

  encoder     DAC's: conv, then per rate (2, 4, 8, 8) three dilated residual units, a Snake and a causal
              strided conv (kernel 2 * rate), the last block followed by a windowed causal transformer
              (4 layers, window 512); then Snake, conv
  downsample  per factor (2, 2): a causal strided conv (kernel = stride) and a ConvNeXt block
  pre         a windowed causal transformer like `post`
  quantizer   code 0 from the semantic codebook, codes 1..N-1 from the residual ones, each the entry
              nearest (after L2 normalisation of both) to its in_proj of what is left to quantize

Everything is causal: a sample depends on its own and earlier frames only. The release's sizes are
not in the checkpoint's name or in a config file (the repository's modded_dac_vq.yaml sets them), so
they are read from the tensors' shapes; the attention heads are 64 wide, as in that yaml.
Weight-normalised convolutions (either of torch's two forms) are folded into plain weights at load.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE = 44100
HEAD_DIM = 64               # modded_dac_vq.yaml: head_dim 64, n_head = dim / 64
POST_WINDOW = 128           # modded_dac_vq.yaml: the quantizer's post_module (and pre_module) window_size
ENCODER_WINDOW = 512        # modded_dac.py: the encoder blocks' transformers (ModelArgs.window_size)


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


class Snake(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x):
        return snake(x, self.alpha)


class CausalConv(nn.Module):
    """A conv padded on the left by its span less its stride, so it sees no later samples; a strided one
    is also padded on the right to a whole last stride, as the release's CausalConvNet."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.pad = (kernel - 1) * dilation + 1 - stride
        self.stride = stride

    def forward(self, x):
        return self.conv(F.pad(x, (self.pad, -x.shape[-1] % self.stride)))


class CausalUpConv(nn.Module):
    """A transposed conv whose extra right tail (kernel - stride samples) is cut off."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x):
        x = self.conv(x)
        return x[..., :x.shape[-1] - self.trim] if self.trim else x


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(Snake(dim), CausalConv(dim, dim, 7, dilation), Snake(dim), CausalConv(dim, dim, 1))

    def forward(self, x):
        return x + self.block(x)


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.block = nn.Sequential(Snake(cin), CausalUpConv(cin, cout, 2 * stride, stride),
                                   ResidualUnit(cout, 1), ResidualUnit(cout, 3), ResidualUnit(cout, 9))

    def forward(self, x):
        return self.block(x)


class Decoder(nn.Module):
    def __init__(self, latent: int, channels: int, rates: list[int]):
        super().__init__()
        layers = [CausalConv(latent, channels, 7)]
        for i, rate in enumerate(rates):
            layers.append(DecoderBlock(channels // 2 ** i, channels // 2 ** (i + 1), rate))
        out = channels // 2 ** len(rates)
        layers += [Snake(out), CausalConv(out, 1, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x):
        return self.model(x)


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int, layers: int):
        super().__init__()
        block = [ResidualUnit(dim // 2, 1), ResidualUnit(dim // 2, 3), ResidualUnit(dim // 2, 9), Snake(dim // 2),
                 CausalConv(dim // 2, dim, 2 * stride, stride=stride)]
        if layers:                  # the release's transformer dims: 64-wide heads, hidden 3 x dim
            block.append(WindowTransformer(dim, 3 * dim, layers, ENCODER_WINDOW))
        self.block = nn.Sequential(*block)

    def forward(self, x):
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, dim: int, rates: list[int], layers: list[int], latent: int):
        super().__init__()
        block = [CausalConv(1, dim, 7)]
        for rate, n in zip(rates, layers):
            dim *= 2
            block.append(EncoderBlock(dim, rate, n))
        block += [Snake(dim), CausalConv(dim, latent, 3)]
        self.block = nn.Sequential(*block)

    def forward(self, x):
        return self.block(x)


class ConvNeXt(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = self.dwconv(x).transpose(1, 2)
        y = self.gamma * self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + y.transpose(1, 2)


# --- the windowed causal transformer ------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_table(positions: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """cos/sin of pair-interleaved rope [P, D/2, 2], rounded to bfloat16 as the release keeps them."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(positions).float(), inv)
    return torch.stack([angles.cos(), angles.sin()], -1).bfloat16()


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; rotates pairs (2i, 2i+1)."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    t = table[None, :, None].float()
    out = torch.stack([xs[..., 0] * t[..., 0] - xs[..., 1] * t[..., 1],
                       xs[..., 1] * t[..., 0] + xs[..., 0] * t[..., 1]], -1)
    return out.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.heads = dim // HEAD_DIM
        self.wqkv = nn.Linear(dim, 3 * self.heads * HEAD_DIM, bias=False)
        self.wo = nn.Linear(self.heads * HEAD_DIM, dim, bias=False)

    def forward(self, x, table, mask):
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).view(b, t, 3, self.heads, HEAD_DIM).unbind(2)
        q, k = apply_rope(q, table), apply_rope(k, table)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.attention, self.feed_forward = Attention(dim), FeedForward(dim, hidden)
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)
        self.attention_layer_scale, self.ffn_layer_scale = LayerScale(dim), LayerScale(dim)

    def forward(self, x, table, mask):
        h = x + self.attention_layer_scale(self.attention(self.attention_norm(x), table, mask))
        return h + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(h)))


class WindowTransformer(nn.Module):
    """Causal, each frame attending to the last `window` frames; channels first in and out."""

    def __init__(self, dim: int, hidden: int, layers: int, window: int = POST_WINDOW):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.window = window

    def forward(self, x):
        t = x.shape[-1]
        i = torch.arange(t, device=x.device)
        mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - self.window)
        table = rope_table(t, HEAD_DIM).to(x.device)
        x = x.transpose(1, 2)
        for layer in self.layers:
            x = layer(x, table, mask)
        return self.norm(x).transpose(1, 2)


# --- the quantizer's decode side and the whole decoder ------------------------------------------------
class Codebook(nn.Module):
    def __init__(self, size: int, dim: int, latent: int):
        super().__init__()
        self.codebook = nn.Embedding(size, dim)
        self.out_proj = nn.Conv1d(dim, latent, 1)

    def forward(self, codes):
        return self.out_proj(self.codebook(codes).transpose(1, 2))


class EncodingCodebook(Codebook):
    """A codebook with its encode side (dac's VectorQuantize)."""

    def __init__(self, size: int, dim: int, latent: int):
        super().__init__(size, dim, latent)
        self.in_proj = nn.Conv1d(latent, dim, 1)

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z [B, latent, T] -> (codes [B, T], their vectors through out_proj [B, latent, T])."""
        z_e = self.in_proj(z)
        e = F.normalize(z_e.transpose(1, 2).reshape(-1, z_e.shape[1]))
        book = F.normalize(self.codebook.weight)
        # nearest by squared distance, written as dac writes it (same rounding, same ties)
        dist = e.pow(2).sum(1, keepdim=True) - 2 * e @ book.t() + book.pow(2).sum(1, keepdim=True).t()
        codes = (-dist).max(1).indices.view(z.shape[0], -1)
        z_q = self.codebook(codes).transpose(1, 2)
        z_q = z_e + (z_q - z_e)         # dac's straight-through form: its rounding, not z_q's
        return codes, self.out_proj(z_q)


class RVQ(nn.Module):
    def __init__(self, n: int, size: int, dim: int, latent: int, codebook=Codebook):
        super().__init__()
        self.quantizers = nn.ModuleList(codebook(size, dim, latent) for _ in range(n))


@dataclass
class CodecSizes:
    latent: int = 1024
    codebook_dim: int = 8
    semantic_size: int = 4096
    residual_size: int = 1024
    residual_codebooks: int = 9
    post_layers: int = 8
    post_hidden: int = 3072
    upsample: tuple = (2, 2)
    decoder_dim: int = 1536
    rates: tuple = (8, 8, 4, 2)
    # the encode side (read only when the checkpoint has it)
    encoder_dim: int = 64
    encoder_rates: tuple = (2, 4, 8, 8)
    encoder_layers: tuple = (0, 0, 0, 4)
    pre_layers: int = 8

    @classmethod
    def from_state(cls, sd: dict) -> "CodecSizes":
        """The sizes from the tensors' shapes (the release ships no codec config)."""
        sem = sd["quantizer.semantic_quantizer.quantizers.0.codebook.weight"]
        res = sd["quantizer.quantizer.quantizers.0.codebook.weight"]
        n_res = len({k.split(".")[3] for k in sd if k.startswith("quantizer.quantizer.quantizers.")})
        post = {int(k.split(".")[3]) for k in sd if k.startswith("quantizer.post_module.layers.")}
        ups = sorted({int(k.split(".")[2]) for k in sd if k.startswith("quantizer.upsample.")})
        upsample = tuple(sd[f"quantizer.upsample.{i}.0.conv.weight"].shape[-1] for i in ups)
        blocks = sorted({int(k.split(".")[2]) for k in sd if k.startswith("decoder.model.")
                         and k.split(".")[3] == "block"})
        rates = tuple(sd[f"decoder.model.{i}.block.1.conv.weight"].shape[-1] // 2 for i in blocks)
        sizes = cls(latent=sd["quantizer.semantic_quantizer.quantizers.0.out_proj.weight"].shape[0],
                    codebook_dim=sem.shape[1], semantic_size=sem.shape[0], residual_size=res.shape[0],
                    residual_codebooks=n_res, post_layers=len(post),
                    post_hidden=sd["quantizer.post_module.layers.0.feed_forward.w1.weight"].shape[0],
                    upsample=upsample, decoder_dim=sd["decoder.model.0.conv.weight"].shape[0], rates=rates)
        if "encoder.block.0.conv.weight" in sd:
            blocks = sorted({int(k.split(".")[2]) for k in sd if k.startswith("encoder.block.")
                             and k.split(".")[3] == "block"})
            layers = [{k.split(".")[6] for k in sd if k.startswith(f"encoder.block.{i}.block.5.layers.")}
                      for i in blocks]
            sizes.encoder_dim = sd["encoder.block.0.conv.weight"].shape[0]
            sizes.encoder_rates = tuple(sd[f"encoder.block.{i}.block.4.conv.weight"].shape[-1] // 2 for i in blocks)
            sizes.encoder_layers = tuple(len(n) for n in layers)
            sizes.pre_layers = len({k.split(".")[3] for k in sd if k.startswith("quantizer.pre_module.layers.")})
        return sizes


class QuantizerDecode(nn.Module):
    """`quantizer.*` of the codec: codebooks, post_module, upsample (the encode side is not loaded)."""

    def __init__(self, s: CodecSizes):
        super().__init__()
        self.semantic_quantizer = RVQ(1, s.semantic_size, s.codebook_dim, s.latent)
        self.quantizer = RVQ(s.residual_codebooks, s.residual_size, s.codebook_dim, s.latent)
        self.post_module = WindowTransformer(s.latent, s.post_hidden, s.post_layers)
        self.upsample = nn.Sequential(*[nn.Sequential(CausalUpConv(s.latent, s.latent, f, f), ConvNeXt(s.latent))
                                        for f in s.upsample])
        self.sizes = s

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, N, T] -> latent [B, latent, T * prod(upsample)]; out-of-range codes are clamped,
        as the release does."""
        s = self.sizes
        z = self.semantic_quantizer.quantizers[0](codes[:, 0].clamp(0, s.semantic_size - 1))
        for i, q in enumerate(self.quantizer.quantizers):
            z = z + q(codes[:, i + 1].clamp(0, s.residual_size - 1))
        return self.upsample(self.post_module(z))


class FishCodec(nn.Module):
    def __init__(self, sizes: CodecSizes):
        super().__init__()
        self.quantizer = QuantizerDecode(sizes)
        self.decoder = Decoder(sizes.latent, sizes.decoder_dim, list(sizes.rates))
        self.sizes = sizes
        self.sample_rate = SAMPLE_RATE
        self.num_codebooks = 1 + sizes.residual_codebooks
        self.frame_samples = math.prod(sizes.upsample) * math.prod(sizes.rates)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, N, T] (long) -> waveform [B, T * frame_samples]."""
        return self.decoder(self.quantizer(codes))[:, 0]


class QuantizerEncode(nn.Module):
    """`quantizer.*` of the codec, encode side: downsample, pre_module, codebooks with in_proj."""

    def __init__(self, s: CodecSizes):
        super().__init__()
        self.semantic_quantizer = RVQ(1, s.semantic_size, s.codebook_dim, s.latent, EncodingCodebook)
        self.quantizer = RVQ(s.residual_codebooks, s.residual_size, s.codebook_dim, s.latent, EncodingCodebook)
        self.downsample = nn.Sequential(*[nn.Sequential(CausalConv(s.latent, s.latent, f, stride=f), ConvNeXt(s.latent))
                                          for f in s.upsample])
        self.pre_module = WindowTransformer(s.latent, s.post_hidden, s.pre_layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """latent [B, latent, T * prod(upsample)] -> codes [B, N, T]: the semantic code, then each
        residual codebook on what the ones before it left."""
        z = self.pre_module(self.downsample(z))
        code, z_q = self.semantic_quantizer.quantizers[0].quantize(z)
        codes, residual = [code], z - z_q
        for q in self.quantizer.quantizers:
            code, z_q = q.quantize(residual)
            codes.append(code)
            residual = residual - z_q
        return torch.stack(codes, 1)


class FishCodecEncoder(nn.Module):
    def __init__(self, sizes: CodecSizes):
        super().__init__()
        self.encoder = Encoder(sizes.encoder_dim, list(sizes.encoder_rates), list(sizes.encoder_layers), sizes.latent)
        self.quantizer = QuantizerEncode(sizes)
        self.sample_rate = SAMPLE_RATE
        self.frame_samples = math.prod(sizes.encoder_rates) * math.prod(sizes.upsample)

    @torch.no_grad()
    def encode(self, wave: torch.Tensor) -> torch.Tensor:
        """wave [S] at 44.1 kHz -> codes [N, ceil(S / frame_samples)] (long). The clip is padded with
        zeros to whole frames, as the release's DAC.encode pads it."""
        x = wave.reshape(1, 1, -1).to(self.encoder.block[0].conv.weight)
        x = F.pad(x, (0, -x.shape[-1] % self.frame_samples))
        return self.quantizer(self.encoder(x))[0]


def fold_weight_norm(sd: dict) -> dict:
    """Plain `weight`s from weight-normalised ones (parametrizations.weight.original0/1 or weight_g/_v)."""
    out = {}
    for key, value in sd.items():
        for g_name, v_name in ((".parametrizations.weight.original0", ".parametrizations.weight.original1"),
                               (".weight_g", ".weight_v")):
            if key.endswith(g_name):
                base = key[:-len(g_name)]
                v = sd[base + v_name]
                norm = v.norm(dim=tuple(range(1, v.ndim)), keepdim=True)
                out[base + ".weight"] = value * v / norm
                break
            if key.endswith(v_name):
                break
        else:
            out[key] = value
    return out


def read_codec_state(path: str | Path) -> dict:
    sd = torch.load(str(path), map_location="cpu", weights_only=True)
    sd = sd.get("state_dict", sd)
    if any(k.startswith("generator.") for k in sd):
        sd = {k[len("generator."):]: v for k, v in sd.items() if k.startswith("generator.")}
    return fold_weight_norm(sd)


def _load(cls, path: str | Path, device, dtype: torch.dtype):
    """One side of codec.pth: the module with the checkpoint's tensors it names (the rest are skipped)."""
    sd = read_codec_state(path)
    with torch.device(device):
        module = cls(CodecSizes.from_state(sd))
    own = module.state_dict()
    missing = [k for k in own if k not in sd]
    if missing:
        raise KeyError(f"{path}: the codec checkpoint lacks {missing[:5]}")
    for k, v in own.items():
        if v.shape != sd[k].shape:
            raise ValueError(f"{path}: {k} has shape {tuple(sd[k].shape)}, expected {tuple(v.shape)}")
    module.load_state_dict({k: sd[k] for k in own})
    return module.to(dtype).eval()


def load_codec(path: str | Path, device="cpu", dtype: torch.dtype = torch.float32) -> FishCodec:
    """codec.pth -> the decoder (its encoder and the quantizer's encode side are skipped)."""
    return _load(FishCodec, path, device, dtype)


def load_codec_encoder(path: str | Path, device="cpu", dtype: torch.dtype = torch.float32) -> FishCodecEncoder:
    """codec.pth -> the encoder (voice cloning); KeyError when the file has no encoder weights."""
    return _load(FishCodecEncoder, path, device, dtype)
