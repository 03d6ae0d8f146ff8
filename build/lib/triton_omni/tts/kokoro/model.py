"""Kokoro-82M (hexgrad; StyleTTS2 with an iSTFTNet vocoder), written here, loading the release files.

    config.json          widths, the phoneme vocabulary, the PL-BERT (ALBERT) settings, the vocoder's rates
    kokoro-v1_0.pth      a dict of five state dicts: bert, bert_encoder, predictor, text_encoder, decoder;
                         keys may carry DataParallel's `module.` prefix; most convolutions are stored
                         as weight norm (`weight_g`, `weight_v`), folded into one weight at load
    voices/<name>.pt     a voice pack [510, 1, 256]: one style per phoneme count (row n - 1 for n
                         phonemes); the first 128 values style the decoder (timbre), the last 128
                         the prosody predictor

Phoneme ids -> PL-BERT -> per-phoneme features -> duration of each phoneme (prosody predictor) ->
frames (each phoneme's features repeated for its duration) -> F0 and energy curves -> decoder
(style-modulated residual blocks) -> generator (a harmonic source built from F0, upsampling,
iSTFT) -> 24 kHz waveform. No sampling: the only randomness is the source's noise, drawn from a
per-request generator (see `SineSource`).

The release code hard-codes some sizes (hidden 512, decoder 1024/512/64 channels, style 128,
24 kHz, 8 overtones); so does this. A checkpoint's own values come from its config.json.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

SAMPLE_RATE = 24000
STYLE = 128                     # each half of a voice style
PARTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
WEIGHTS_FILE = "kokoro-v1_0.pth"
MAX_PHONEMES = 510              # PL-BERT's 512 positions less the two boundary tokens
SQRT_HALF = math.sqrt(0.5)


class WNConv1d(nn.Conv1d):
    """A convolution the release file stores with weight norm (weight_g, weight_v)."""


class WNConvTranspose1d(nn.ConvTranspose1d):
    """A transposed convolution the release file stores with weight norm."""


def leaky(x: torch.Tensor, slope: float) -> torch.Tensor:
    return F.leaky_relu(x, slope)


@functools.cache
def cudnn_lstm_works(device: torch.device) -> bool:
    """Whether cuDNN can run an LSTM on `device`. A CUDA torch can load an older cuDNN than the one it
    was built with (a system copy earlier on the library path): its convolutions still run, its
    RNNs fail. Then the LSTMs run on torch's own CUDA kernels (same math, slower)."""
    if device.type != "cuda" or not torch.backends.cudnn.is_available():
        return True
    try:
        nn.LSTM(4, 2, batch_first=True, bidirectional=True).to(device)(torch.zeros(1, 3, 4, device=device))
        return True
    except RuntimeError as exc:
        print(f"[kokoro] cuDNN cannot run LSTMs here ({str(exc).splitlines()[0]}); using torch's CUDA LSTM")
        return False


def lstm_cudnn(device: torch.device):
    """A context in which LSTMs on `device` work: cuDNN off where it cannot run them (moving an LSTM
    to the device already asks cuDNN to flatten its weights, so loading needs this too)."""
    return contextlib.nullcontext() if cudnn_lstm_works(device) else torch.backends.cudnn.flags(enabled=False)


def run_lstm(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """A bidirectional LSTM over [B, T, C] rows. Padded rows (`lengths`; None: none is padded) are
    packed so that each row's backward pass starts at its own end. Packing costs a host sync each
    way on a GPU; a row alone gets the same numbers unpacked. LSTMs stay float32 (they are small;
    see `Kokoro.to_dtype`)."""
    dtype, x = x.dtype, x.float()
    with lstm_cudnn(x.device):
        if lengths is None:
            return lstm(x)[0].to(dtype)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=x.shape[1])
    return out.to(dtype)


def masked(x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
    """[B, C, T] with zeros where pad [B, T] is True (past a row's end); no pad, no kernel."""
    return x if pad is None else x.masked_fill(pad[:, None], 0.0)


class ChannelNorm(nn.Module):
    """Layer norm over the channels of [B, C, T] (the release names its parameters gamma, beta)."""

    def __init__(self, channels: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x):
        return F.layer_norm(x.transpose(1, 2), x.shape[1:2], self.gamma, self.beta, 1e-5).transpose(1, 2)


class AdaIN(nn.Module):
    """Instance norm over time, scaled and shifted by the style (no affine weights of its own)."""

    def __init__(self, style: int, channels: int):
        super().__init__()
        self.fc = nn.Linear(style, 2 * channels)

    def forward(self, x, s):
        gamma, beta = self.fc(s)[:, :, None].chunk(2, dim=1)
        return (1 + gamma) * F.instance_norm(x, eps=1e-5) + beta


class AdaLayerNorm(nn.Module):
    """Layer norm over the channels of [B, T, C], scaled and shifted by the style."""

    def __init__(self, style: int, channels: int):
        super().__init__()
        self.fc = nn.Linear(style, 2 * channels)

    def forward(self, x, s):
        gamma, beta = self.fc(s)[:, None].chunk(2, dim=-1)
        return (1 + gamma) * F.layer_norm(x, x.shape[-1:], eps=1e-5) + beta


class StyleResBlock(nn.Module):
    """Residual block of two convolutions with AdaIN; with `upsample` it doubles the frames."""

    def __init__(self, dim_in: int, dim_out: int, style: int, upsample: bool = False):
        super().__init__()
        self.upsample = upsample
        self.conv1 = WNConv1d(dim_in, dim_out, 3, 1, 1)
        self.conv2 = WNConv1d(dim_out, dim_out, 3, 1, 1)
        self.norm1 = AdaIN(style, dim_in)
        self.norm2 = AdaIN(style, dim_out)
        if dim_in != dim_out:
            self.conv1x1 = WNConv1d(dim_in, dim_out, 1, 1, 0, bias=False)
        if upsample:        # depthwise, stride 2: the residual path's upsampling
            self.pool = WNConvTranspose1d(dim_in, dim_in, 3, 2, groups=dim_in, padding=1, output_padding=1)

    def forward(self, x, s):
        h = leaky(self.norm1(x, s), 0.2)
        if self.upsample:
            h = self.pool(h)
        h = self.conv2(leaky(self.norm2(self.conv1(h), s), 0.2))
        skip = F.interpolate(x, scale_factor=2, mode="nearest") if self.upsample else x
        if hasattr(self, "conv1x1"):
            skip = self.conv1x1(skip)
        return (h + skip) * SQRT_HALF


def snake(x, alpha, inv_alpha):
    return x + inv_alpha * torch.sin(alpha * x) ** 2


class SnakeResBlock(nn.Module):
    """The generator's residual block: three (AdaIN, snake, dilated conv, AdaIN, snake, conv) units."""

    def __init__(self, channels: int, kernel: int, dilations: list[int], style: int):
        super().__init__()
        pad = lambda d: d * (kernel - 1) // 2  # noqa: E731 - keeps the length
        self.convs1 = nn.ModuleList(WNConv1d(channels, channels, kernel, 1, pad(d), dilation=d) for d in dilations)
        self.convs2 = nn.ModuleList(WNConv1d(channels, channels, kernel, 1, pad(1)) for _ in dilations)
        self.adain1 = nn.ModuleList(AdaIN(style, channels) for _ in dilations)
        self.adain2 = nn.ModuleList(AdaIN(style, channels) for _ in dilations)
        self.alpha1 = nn.ParameterList(nn.Parameter(torch.ones(1, channels, 1)) for _ in dilations)
        self.alpha2 = nn.ParameterList(nn.Parameter(torch.ones(1, channels, 1)) for _ in dilations)

    def forward(self, x, s):
        # 1 / alpha of all six snakes in two kernels rather than two each (the same values)
        inv1, inv2 = torch.reciprocal(torch.stack([*self.alpha1, *self.alpha2])).split(len(self.alpha1))
        units = zip(self.convs1, self.convs2, self.adain1, self.adain2, self.alpha1, self.alpha2, inv1, inv2)
        for c1, c2, n1, n2, a1, a2, i1, i2 in units:
            h = c1(snake(n1(x, s), a1, i1))
            x = x + c2(snake(n2(h, s), a2, i2))
        return x


class TextEncoder(nn.Module):
    """Phoneme embeddings -> convolutions -> bidirectional LSTM: the decoder's content features."""

    def __init__(self, channels: int, kernel: int, depth: int, n_symbols: int):
        super().__init__()
        self.embedding = nn.Embedding(n_symbols, channels)
        # (conv, norm) pairs; the release's activation and dropout between them hold no weights
        self.cnn = nn.ModuleList(nn.Sequential(WNConv1d(channels, channels, kernel, padding=(kernel - 1) // 2),
                                               ChannelNorm(channels)) for _ in range(depth))
        self.lstm = nn.LSTM(channels, channels // 2, 1, batch_first=True, bidirectional=True)

    def forward(self, ids, lengths, pad):
        """ids [B, T], pad [B, T] (True past a row's end; None: no row is padded) -> [B, C, T], zero
        past each row's end."""
        x = masked(self.embedding(ids).transpose(1, 2), pad)
        for conv, norm in self.cnn:
            x = masked(leaky(norm(conv(x)), 0.2), pad)
        x = run_lstm(self.lstm, x.transpose(1, 2), lengths).transpose(1, 2)
        return masked(x, pad)


class DurationEncoder(nn.Module):
    """LSTMs alternating with AdaLayerNorm; the predictor's style is appended to every position."""

    def __init__(self, style: int, d_model: int, layers: int):
        super().__init__()
        self.lstms = nn.ModuleList()
        for _ in range(layers):
            self.lstms.append(nn.LSTM(d_model + style, d_model // 2, 1, batch_first=True, bidirectional=True))
            self.lstms.append(AdaLayerNorm(style, d_model))

    def forward(self, x, s, lengths, pad):
        """x [B, d_model, T] -> [B, T, d_model + style]."""
        styles = s[:, :, None].expand(-1, -1, x.shape[2])
        x = masked(torch.cat([x, styles], 1), pad)
        for block in self.lstms:
            if isinstance(block, AdaLayerNorm):
                x = block(x.transpose(1, 2), s).transpose(1, 2)
                x = masked(torch.cat([x, styles], 1), pad)
            else:
                x = run_lstm(block, x.transpose(1, 2), lengths).transpose(1, 2)
        return x.transpose(1, 2)


class ProsodyPredictor(nn.Module):
    def __init__(self, style: int, d_hid: int, layers: int, max_dur: int):
        super().__init__()
        self.text_encoder = DurationEncoder(style, d_hid, layers)
        self.lstm = nn.LSTM(d_hid + style, d_hid // 2, 1, batch_first=True, bidirectional=True)
        self.duration_proj = nn.ModuleDict({"linear_layer": nn.Linear(d_hid, max_dur)})
        self.shared = nn.LSTM(d_hid + style, d_hid // 2, 1, batch_first=True, bidirectional=True)
        half = d_hid // 2
        curve = lambda: nn.ModuleList([StyleResBlock(d_hid, d_hid, style),  # noqa: E731
                                       StyleResBlock(d_hid, half, style, upsample=True),
                                       StyleResBlock(half, half, style)])
        self.F0, self.N = curve(), curve()
        self.F0_proj = nn.Conv1d(half, 1, 1)
        self.N_proj = nn.Conv1d(half, 1, 1)

    def durations(self, d, lengths, speed):
        """d [B, T, C] -> frames per phoneme [B, T] (at least 1; the sum of max_dur sigmoids / speed)."""
        x = run_lstm(self.lstm, d, lengths)
        dur = torch.sigmoid(self.duration_proj["linear_layer"](x).float()).sum(-1) / speed[:, None]
        return torch.round(dur).clamp(min=1).long()

    def curves(self, en, s):
        """Frame features [1, C, F] -> F0 and energy curves [1, 2F]."""
        x = run_lstm(self.shared, en.transpose(1, 2)).transpose(1, 2)
        f0, n = x, x
        for block in self.F0:
            f0 = block(f0, s)
        for block in self.N:
            n = block(n, s)
        return self.F0_proj(f0)[:, 0], self.N_proj(n)[:, 0]


class SineSource(nn.Module):
    """The harmonic source: F0 and 8 overtones as sines where voiced (F0 > 10 Hz), plus noise (louder
    where unvoiced), merged to one signal.

    Phase: the release computes each sample's phase increment from the F0 repeated per sample, then
    interpolates back to one value per frame before the cumulative sum: that is the frame's own
    value, so it is taken per frame here; the phase is then interpolated up to samples as there.

    Noise: drawn from the request's generator in the release's order (a random start phase for each
    overtone, which the release adds to a sample its interpolation never reads, so only the draw is
    kept; then the noise), so a seeded request equals the release under the same torch seed.
    Without a generator there is no noise. The noise is drawn where the generator is: a generator on
    the model's device keeps the draws (2 M normals for 10 s of audio: tens of ms on the host, element
    by element) and their copy off the host, and there draws as the release does on that device.
    """

    def __init__(self, upsample: int):
        super().__init__()
        self.upsample = upsample
        self.l_linear = nn.Linear(9, 1)

    def forward(self, f0, noise: torch.Generator | None):
        """f0 [1, L] (Hz per frame) -> [1, L * upsample] float32."""
        f0 = f0.float()
        harmonics = f0[:, :, None] * torch.arange(1, 10, device=f0.device, dtype=f0.dtype)
        phase = torch.cumsum(harmonics / SAMPLE_RATE % 1, dim=1) * 2 * math.pi
        phase = F.interpolate(phase.transpose(1, 2) * self.upsample, scale_factor=self.upsample, mode="linear")
        sines = 0.1 * torch.sin(phase.transpose(1, 2))                             # [1, N, 9]
        voiced = (f0 > 10).float().repeat_interleave(self.upsample, dim=1)[:, :, None]
        wave = sines * voiced
        if noise is not None:
            torch.rand(f0.shape[0], 9, generator=noise, device=noise.device)      # the unused start phases
            # the release's randn_like fills a transposed [1, N, 9] tensor (element by element, not
            # torch's vectorized path for contiguous ones): the same tensor, filled the same way
            z = torch.empty(sines.shape[0], 9, sines.shape[1], device=noise.device).transpose(1, 2)
            z = z.normal_(generator=noise).to(f0.device)
            wave = wave + (voiced * 0.003 + (1 - voiced) * 0.1 / 3) * z
        return torch.tanh(F.linear(wave, self.l_linear.weight.float(), self.l_linear.bias.float()))[:, :, 0]


class Generator(nn.Module):
    """iSTFTNet: upsampling with source-driven residuals, then magnitude/phase -> inverse STFT."""

    def __init__(self, style: int, kernel_sizes, rates, channels, dilations, up_kernels, n_fft, hop):
        super().__init__()
        self.n_fft, self.hop, self.kernels = n_fft, hop, len(kernel_sizes)
        self.m_source = SineSource(math.prod(rates) * hop)
        self.ups = nn.ModuleList(WNConvTranspose1d(channels // 2 ** i, channels // 2 ** (i + 1), k, u,
                                                   padding=(k - u) // 2)
                                 for i, (u, k) in enumerate(zip(rates, up_kernels)))
        self.resblocks = nn.ModuleList()
        self.noise_convs = nn.ModuleList()
        self.noise_res = nn.ModuleList()
        for i in range(len(rates)):
            ch = channels // 2 ** (i + 1)
            self.resblocks.extend(SnakeResBlock(ch, k, d, style) for k, d in zip(kernel_sizes, dilations))
            if i + 1 < len(rates):          # the source's STFT frames, strided down to this stage's rate
                stride = math.prod(rates[i + 1:])
                self.noise_convs.append(nn.Conv1d(n_fft + 2, ch, stride * 2, stride, (stride + 1) // 2))
                self.noise_res.append(SnakeResBlock(ch, 7, [1, 3, 5], style))
            else:
                self.noise_convs.append(nn.Conv1d(n_fft + 2, ch, 1))
                self.noise_res.append(SnakeResBlock(ch, 11, [1, 3, 5], style))
        self.conv_post = WNConv1d(ch, n_fft + 2, 7, 1, 3)

    def forward(self, x, s, f0, noise):
        window = torch.hann_window(self.n_fft, device=x.device)     # float32 whatever the weights' dtype
        source = self.m_source(f0, noise)
        spec = torch.stft(source, self.n_fft, self.hop, self.n_fft, window, return_complex=True)
        har = torch.cat([spec.abs(), spec.angle()], 1).to(x.dtype)
        for i, up in enumerate(self.ups):
            x = leaky(x, 0.1)
            x_source = self.noise_res[i](self.noise_convs[i](har), s)
            x = up(x)
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + x_source
            blocks = self.resblocks[i * self.kernels:(i + 1) * self.kernels]
            x = sum(block(x, s) for block in blocks) / self.kernels
        x = self.conv_post(leaky(x, 0.01)).float()
        bins = self.n_fft // 2 + 1
        spec = torch.polar(torch.exp(x[:, :bins]), torch.sin(x[:, bins:]))
        return torch.istft(spec, self.n_fft, self.hop, self.n_fft, window)


class Decoder(nn.Module):
    def __init__(self, dim_in: int, style: int, istftnet: dict):
        super().__init__()
        self.encode = StyleResBlock(dim_in + 2, 1024, style)
        self.decode = nn.ModuleList([StyleResBlock(1024 + 2 + 64, 1024, style) for _ in range(3)]
                                    + [StyleResBlock(1024 + 2 + 64, 512, style, upsample=True)])
        self.F0_conv = WNConv1d(1, 1, 3, 2, 1)
        self.N_conv = WNConv1d(1, 1, 3, 2, 1)
        self.asr_res = nn.Sequential(WNConv1d(512, 64, 1))
        c = istftnet
        self.generator = Generator(style, c["resblock_kernel_sizes"], c["upsample_rates"],
                                   c["upsample_initial_channel"], c["resblock_dilation_sizes"],
                                   c["upsample_kernel_sizes"], c["gen_istft_n_fft"], c["gen_istft_hop_size"])

    def forward(self, asr, f0, n, s, noise):
        """asr [1, 512, F], f0 and n [1, 2F] -> waveform [1, samples]."""
        f0_down, n_down = self.F0_conv(f0[:, None].to(asr.dtype)), self.N_conv(n[:, None].to(asr.dtype))
        x = self.encode(torch.cat([asr, f0_down, n_down], 1), s)
        res = self.asr_res(asr)
        for block in self.decode:       # every block sees the content and the curves again
            x = block(torch.cat([x, res, f0_down, n_down], 1), s)
        return self.generator(x, s, f0, noise)


class Kokoro(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        from transformers import AlbertConfig, AlbertModel

        self.config = config
        self.vocab: dict[str, int] = config["vocab"]
        hidden, style = config["hidden_dim"], config["style_dim"]
        if hidden != 512 or style != STYLE:
            raise ValueError(f"Kokoro's decoder is built for hidden_dim 512 and style_dim {STYLE}; "
                             f"config.json has {hidden} and {style}")
        self.bert = AlbertModel(AlbertConfig(vocab_size=config["n_token"], **config["plbert"]))
        self.bert_encoder = nn.Linear(self.bert.config.hidden_size, hidden)
        self.predictor = ProsodyPredictor(style, hidden, config["n_layer"], config["max_dur"])
        self.text_encoder = TextEncoder(hidden, config["text_encoder_kernel_size"], config["n_layer"],
                                        config["n_token"])
        self.decoder = Decoder(hidden, style, config["istftnet"])

    @property
    def device(self) -> torch.device:
        return self.bert_encoder.weight.device

    def to_dtype(self, dtype: torch.dtype) -> "Kokoro":
        """Weights in `dtype` except the LSTMs and the source's merge (float32: small, and cuDNN's
        reduced-precision LSTMs round the durations differently for little gain)."""
        self.to(dtype)
        for m in self.modules():
            if isinstance(m, nn.LSTM):
                m.float()
        return self

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "Kokoro":
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        model = cls(config)
        model.load_release(torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True))
        with lstm_cudnn(torch.device(device)):
            return model.to(device).to_dtype(dtype).eval()

    def load_release(self, release: dict[str, dict[str, torch.Tensor]]) -> None:
        """The release's five state dicts, strictly: every weight the model has, nothing else."""
        for part in PARTS:
            state = {k.removeprefix("module."): v for k, v in release[part].items()}
            state = {k: v for k, v in fold_weight_norm(state).items() if k != "embeddings.position_ids"}
            getattr(self, part).load_state_dict(state, strict=True)

    @torch.inference_mode()     # not just no_grad: ops skip autograd's dispatch, less host time per kernel
    def synthesize(self, rows: list[list[int]], styles: torch.Tensor, speeds: torch.Tensor,
                   noise: list[torch.Generator | None]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Phoneme id rows (each with its boundary 0s), styles [B, 256], speeds [B] -> per row the
        waveform [samples] (float32, on the model's device) and the frames of each phoneme.

        The text side (PL-BERT, duration LSTMs, text encoder) runs on all rows at once, padded.
        From the durations on, each row runs alone: rows have different frame counts, and the
        instance norms over time would see another row's padding.

        A row batched with others rounds differently in the last bits than alone (matrix products
        of another size). Durations and F0 stay the same to rounding, but the vocoder reads the
        phase of its source's STFT, which jumps where a bin is near silent, so the samples differ
        while durations and pitch do not. Alone, a row is bit for bit the release code's output."""
        dev, dtype = self.device, self.bert_encoder.weight.dtype
        sizes = [len(r) for r in rows]
        ids = torch.zeros(len(rows), max(sizes), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
        # lengths and pad only where rows differ in length: masks and packed LSTMs are kernels and
        # host syncs on a GPU, and a row alone gets the same numbers without them
        lengths = pad = None
        if min(sizes) < max(sizes):
            lengths = torch.tensor(sizes)
            pad = (torch.arange(ids.shape[1])[None] >= lengths[:, None]).to(dev)
        ids, styles, speeds = ids.to(dev), styles.to(dev, dtype), speeds.to(dev, torch.float32)
        bert = self.bert(ids, attention_mask=None if pad is None else (~pad).long()).last_hidden_state
        d_en = self.bert_encoder(bert).transpose(1, 2)
        timbre, prosody = styles[:, :STYLE], styles[:, STYLE:]
        d = self.predictor.text_encoder(d_en, prosody, lengths, pad)
        frames = self.predictor.durations(d, lengths, speeds)
        t_en = self.text_encoder(ids, lengths, pad)
        # every row's frame count from one read of the (small) frames matrix (repeat_interleave would
        # read it itself, twice a row)
        host = frames.cpu()
        totals = [int(host[i, :n].sum()) for i, n in enumerate(sizes)]
        out = []
        for i, (n, total) in enumerate(zip(sizes, totals)):
            dur = frames[i, :n]
            en = d[i, :n].T.repeat_interleave(dur, dim=1, output_size=total)[None]   # each phoneme held for its frames
            asr = t_en[i, :, :n].repeat_interleave(dur, dim=1, output_size=total)[None]
            f0, energy = self.predictor.curves(en, prosody[i:i + 1])
            wave = self.decoder(asr, f0, energy, timbre[i:i + 1], noise[i])
            out.append((wave[0], dur))
        return out


def channel_norm(w: torch.Tensor) -> torch.Tensor:
    """The norm of each slice along the first dim, shaped [n, 1, ...] (weight norm's g)."""
    return w.flatten(1).norm(dim=1).view(-1, *[1] * (w.dim() - 1))


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`x.weight_g`, `x.weight_v` -> `x.weight` = g * v / |v| (norm over all but the first dim), by
    torch's own weight-norm kernel: the bits the release code computes on every call. They matter:
    the vocoder reads the phase of its source's STFT, which jumps where a bin is near silent, so
    an F0 one rounding away gives audibly the same but numerically different audio."""
    out = {}
    for k, v in state.items():
        if k.endswith(".weight_g"):
            base = k[:-len("_g")]
            out[base] = torch._weight_norm(state[base + "_v"], v, 0)
        elif not k.endswith(".weight_v"):
            out[k] = v
    return out


def release_state_dicts(model: Kokoro, v_scale: float = 1.7) -> dict[str, dict[str, torch.Tensor]]:
    """The model's weights in the release layout (`module.` prefix, weight norm split into g and v,
    v scaled so that folding is not the identity): what the tiny checkpoint builder writes."""
    release = {}
    for part in PARTS:
        module = getattr(model, part)
        state = {}
        for name, tensor in module.state_dict().items():
            owner = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
            if isinstance(owner, (WNConv1d, WNConvTranspose1d)) and name.endswith(".weight"):
                state[name + "_g"] = channel_norm(tensor)
                state[name + "_v"] = tensor * v_scale
            else:
                state[name] = tensor.clone()
        if part == "bert":
            state["embeddings.position_ids"] = torch.arange(model.bert.config.max_position_embeddings)[None]
        release[part] = {f"module.{k}": v for k, v in state.items()}
    return release


def load_voice(path: str | Path) -> torch.Tensor:
    """A voice pack [510, 1, 256] -> [510, 256] float32."""
    pack = torch.load(path, map_location="cpu", weights_only=True).float()
    if pack.dim() != 3 or pack.shape[1] != 1 or pack.shape[2] != 2 * STYLE:
        raise ValueError(f"{path}: a voice pack is [510, 1, {2 * STYLE}], got {list(pack.shape)}")
    return pack[:, 0]


def voice_style(pack: torch.Tensor, phonemes: int) -> torch.Tensor:
    """The style for an utterance of `phonemes` phonemes (the release picks row phonemes - 1)."""
    return pack[min(max(phonemes, 1), pack.shape[0]) - 1]
