"""Chatterbox voice cloning: a reference clip -> the conditioning ChatterboxTTS.prepare_conditionals computes
(the `chatterbox-tts` package 0.1.7), run once per request in the served pre step, on the CPU.

From the clip decoded at 24 kHz:
- S3Gen's reference (the first 10 s): the 80-bin log-mel of the 24 kHz clip (`prompt_feat`), and, of that
  clip resampled to 16 kHz, its S3 speech tokens (`prompt_token`, 25 a second) and the CAMPPlus x-vector
  over Kaldi fbank features (`embedding`, 192).
- T3's voice, from the whole clip at 16 kHz: the voice encoder's speaker embedding (256; silence trimmed,
  40-bin mels cut into overlapping partials, LSTM, mean of the unit vectors) and the S3 tokens of the
  first 6 s (at most 150: T3's prompt speech tokens).

Resampling: S3Gen's 24 -> 16 kHz is torchaudio's Hann-windowed sinc resampler, rebuilt here exactly
(`resample`). For T3 the package resamples with librosa's default (soxr "HQ"), which torch/numpy do not
have: FFmpeg's resampler (PyAV, as the request's clip is decoded) stands in, being the closer of the two
to soxr (tests/test_tts_chatterbox.py measures the difference). Clips that are not 24 kHz files are
decoded to 24 kHz by FFmpeg's resampler where the package uses soxr too.

The modules keep the package's parameter names (s3gen.safetensors' `tokenizer.*` and `speaker_encoder.*`,
ve.safetensors) so the release files load as they are.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.media.audio_signal import mel_filters     # librosa's Slaney mel filters
from triton_omni.tts.chatterbox.t3 import Voice, read_config

S3GEN_RATE, S3_RATE = 24000, 16000
S3GEN_CLIP_SECONDS, T3_CLIP_SECONDS = 10, 6      # ChatterboxTTS.DEC_COND_LEN / ENC_COND_LEN
T3_PROMPT_TOKENS = 150                           # T3Config.speech_cond_prompt_len


def resample(wave: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """torchaudio.transforms.Resample(orig, new) with its defaults (Hann-windowed sinc, 6 zero crossings,
    roll-off 0.99, kernel built in float64 and kept in float32): [S] -> [ceil(S * new / orig)]."""
    if orig == new:
        return wave
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    zeros, base = 6, min(orig, new) * 0.99
    width = math.ceil(zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    # the output phases are divided in the default dtype before joining the float64 grid, as torchaudio does
    t = (torch.arange(0, -new, -1)[:, None, None] / new + idx) * base
    t = t.clamp(-zeros, zeros)
    window = torch.cos(t * math.pi / zeros / 2) ** 2
    t = t * math.pi
    kernel = (torch.where(t == 0, torch.ones_like(t), t.sin() / t) * (window * (base / orig))).float()
    x = F.pad(wave.reshape(1, 1, -1).float(), (width, width + orig))
    out = F.conv1d(x, kernel.to(wave.device), stride=orig).transpose(1, 2).reshape(-1)
    return out[:math.ceil(new * wave.shape[-1] / orig)]


def s3gen_mel(wave: torch.Tensor) -> torch.Tensor:
    """S3Gen's prompt mel (Matcha's mel_spectrogram, CosyVoice's settings): 24 kHz [S] -> [1, S // 480, 80].
    Reflect-padded by 720 each side, uncentred Hann STFT (1920), magnitude, 80 Slaney mels to 8 kHz, log."""
    basis = torch.from_numpy(mel_filters(S3GEN_RATE, 1920, 80, 0.0, 8000.0)).to(wave.device)
    y = F.pad(wave.reshape(1, 1, -1), (720, 720), mode="reflect")[:, 0]
    spec = torch.stft(y, 1920, hop_length=480, win_length=1920, window=torch.hann_window(1920, device=wave.device),
                      center=False, normalized=False, onesided=True, return_complex=True)
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis @ spec, min=1e-5)).transpose(1, 2)


# --- S3 speech tokenizer (s3tokenizer's S3TokenizerV2: a small Whisper-like encoder + FSQ) -------------------
class _Attention(nn.Module):
    """Self attention with rotary positions plus an FSMN memory (a depthwise convolution over the values)."""

    def __init__(self, dim: int, heads: int, kernel: int = 31):
        super().__init__()
        self.heads = heads
        self.query, self.value, self.out = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim, bias=False)
        self.fsmn_block = nn.Conv1d(dim, dim, kernel, groups=dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1) for f in (self.query, self.key, self.value))
        rotate = lambda u: torch.cat([-u[..., u.shape[-1] // 2:], u[..., :u.shape[-1] // 2]], dim=-1)  # noqa: E731
        q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
        pad = (self.fsmn_block.kernel_size[0] - 1) // 2
        flat = v.reshape(b, t, d)
        memory = self.fsmn_block(F.pad(flat.transpose(1, 2), (pad, pad))).transpose(1, 2) + flat
        scale = (d // self.heads) ** -0.25                     # split between queries and keys, as the package
        w = torch.softmax((q.permute(0, 2, 1, 3) * scale) @ (k.permute(0, 2, 3, 1) * scale), dim=-1)
        return self.out((w @ v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3).flatten(2)) + memory


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attn, self.attn_ln = _Attention(dim, heads), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.mlp_ln = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_ln(x), cos, sin)
        return x + self.mlp(self.mlp_ln(x))


class S3Tokenizer(nn.Module):
    """16 kHz audio -> S3 speech tokens (25 a second, ids < 6561). Sizes: s3tokenizer's ModelConfig
    (n_mels 128, n_audio_state 1280, n_audio_head 20, n_audio_layer 6 in the release); heads of 64."""

    ROTARY_DIM = 64                                  # fixed in the package, whatever the width

    def __init__(self, n_mels: int = 128, n_audio_state: int = 1280, n_audio_head: int = 20, n_audio_layer: int = 6):
        super().__init__()
        self.n_mels = n_mels
        self.encoder = nn.Module()
        self.encoder.conv1 = nn.Conv1d(n_mels, n_audio_state, 3, stride=2, padding=1)
        self.encoder.conv2 = nn.Conv1d(n_audio_state, n_audio_state, 3, stride=2, padding=1)
        self.encoder.blocks = nn.ModuleList(_Block(n_audio_state, n_audio_head) for _ in range(n_audio_layer))
        self.quantizer = nn.Module()
        self.quantizer._codebook = nn.Module()
        self.quantizer._codebook.project_down = nn.Linear(n_audio_state, 8)
        self.register_buffer("mel_basis", torch.from_numpy(mel_filters(S3_RATE, 400, n_mels, 0.0, 8000.0)),
                             persistent=False)

    def log_mel(self, wave: torch.Tensor) -> torch.Tensor:
        """Whisper's log-mel: [S] -> [n_mels, S // 160] (centred STFT of 400, the last frame dropped)."""
        spec = torch.stft(wave, 400, 160, window=torch.hann_window(400, device=wave.device), return_complex=True)
        mel = torch.clamp(self.mel_basis @ spec[..., :-1].abs() ** 2, min=1e-10).log10()
        return (torch.maximum(mel, mel.max() - 8.0) + 4.0) / 4.0

    def forward(self, wave: torch.Tensor, max_tokens: int | None = None) -> torch.Tensor:
        """16 kHz [S] -> tokens [ceil(S // 160 / 4)] (int64); `max_tokens` keeps the first mel frames only,
        after the log-mel's level is set by the whole clip (the package's max_len)."""
        mel = self.log_mel(wave)
        if max_tokens is not None:
            mel = mel[:, :4 * max_tokens]
        enc = self.encoder
        x = F.gelu(enc.conv2(F.gelu(enc.conv1(mel[None])))).transpose(1, 2)
        half = self.ROTARY_DIM // 2
        freqs = 1.0 / (10000.0 ** (torch.arange(0, self.ROTARY_DIM, 2)[:half].float() / self.ROTARY_DIM))
        angles = torch.polar(torch.ones(x.shape[1], half), torch.outer(torch.arange(x.shape[1]), freqs))
        angles = torch.cat([angles, angles], dim=-1).to(x.device)
        cos, sin = angles.real[None, :, None], angles.imag[None, :, None]
        for block in enc.blocks:
            x = block(x, cos, sin)
        # FSQ: 8 projections, each rounded to -1 / 0 / 1, read as base-3 digits
        digits = (self.quantizer._codebook.project_down(x).float().tanh() * 0.9990000128746033).round() + 1
        return (digits * 3.0 ** torch.arange(8, device=x.device)).sum(-1)[0].long()


# --- CAMPPlus x-vector (3D-Speaker's CAM++, as CosyVoice / the package build it) ----------------------
def kaldi_fbank(wave: torch.Tensor, bins: int = 80, rate: int = S3_RATE) -> torch.Tensor:
    """torchaudio.compliance.kaldi.fbank(wave[None], num_mel_bins=bins) with its defaults: 25 ms frames every
    10 ms (snip edges), DC removed, pre-emphasis 0.97, Povey window, 512-point power spectrum, Kaldi's
    triangular mel bins from 20 Hz to Nyquist, log floored at float32 eps. [S] -> [frames, bins]."""
    size, shift, fft = 400, 160, 512
    frames = wave.unfold(0, size, shift)
    frames = frames - frames.mean(dim=1, keepdim=True)
    frames = frames - 0.97 * torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames * torch.hann_window(size, periodic=False, device=wave.device).pow(0.85)
    power = torch.fft.rfft(F.pad(frames, (0, fft - size))).abs().pow(2.0)
    # the bins in float32 with the operation order of torchaudio's get_mel_banks (so they match to the bit)
    mel_of = lambda f: 1127.0 * math.log(1.0 + f / 700.0)  # noqa: E731
    low, high = mel_of(20.0), mel_of(rate / 2)
    delta = (high - low) / (bins + 1)
    b = torch.arange(bins).unsqueeze(1)
    left, center, right = low + b * delta, low + (b + 1.0) * delta, low + (b + 2.0) * delta
    mel = 1127.0 * (1.0 + rate / fft * torch.arange(fft / 2) / 700.0).log()
    banks = torch.max(torch.zeros(1), torch.min((mel - left) / (center - left), (right - mel) / (right - center)))
    banks = F.pad(banks, (0, 1)).to(wave.device)
    return torch.max(power @ banks.T, torch.tensor(torch.finfo(torch.float32).eps, device=wave.device)).log()


def _bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(channels), relu=nn.ReLU()))


class _ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=(stride, 1), bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + self.shortcut(x))


class _FCM(nn.Module):
    """The 2-D front end over (mel bins, time): strides halve the bins three times, time is kept."""

    def __init__(self, channels: int = 32, feat_dim: int = 80):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.layer1 = nn.Sequential(_ResBlock(channels, channels, 2), _ResBlock(channels, channels, 1))
        self.layer2 = nn.Sequential(_ResBlock(channels, channels, 2), _ResBlock(channels, channels, 1))
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.out_channels = channels * (feat_dim // 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer2(self.layer1(F.relu(self.bn1(self.conv1(x[:, None])))))
        out = F.relu(self.bn2(self.conv2(out)))
        return out.flatten(1, 2)


class _CAMLayer(nn.Module):
    """A dilated convolution gated by context: the clip's mean plus 100-frame segment means."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int):
        super().__init__()
        self.linear_local = nn.Conv1d(c_in, c_out, kernel, padding=(kernel - 1) // 2 * dilation, dilation=dilation,
                                      bias=False)
        self.linear1 = nn.Conv1d(c_in, c_in // 2, 1)
        self.linear2 = nn.Conv1d(c_in // 2, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seg = F.avg_pool1d(x, kernel_size=100, stride=100, ceil_mode=True)
        seg = seg.repeat_interleave(100, dim=-1)[..., :x.shape[-1]]
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(-1, keepdim=True) + seg))))
        return self.linear_local(x) * gate


class _DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth: int, bottleneck: int, kernel: int, dilation: int):
        super().__init__()
        self.nonlinear1 = _bn_relu(c_in)
        self.linear1 = nn.Conv1d(c_in, bottleneck, 1, bias=False)
        self.nonlinear2 = _bn_relu(bottleneck)
        self.cam_layer = _CAMLayer(bottleneck, growth, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))


class _Transit(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.nonlinear = _bn_relu(c_in)
        self.linear = nn.Conv1d(c_in, c_out, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class CAMPPlus(nn.Module):
    """Kaldi fbank (mean-normalised) -> 192-d x-vector. Arguments as the package's CAMPPlus (the release uses
    its defaults: growth_rate 32, bn_size 4, init_channels 128)."""

    def __init__(self, feat_dim: int = 80, embedding_size: int = 192, growth_rate: int = 32, bn_size: int = 4,
                 init_channels: int = 128):
        super().__init__()
        self.head = _FCM(feat_dim=feat_dim)
        x = nn.Module()
        x.tdnn = nn.Module()
        x.tdnn.linear = nn.Conv1d(self.head.out_channels, init_channels, 5, stride=2, padding=2, bias=False)
        x.tdnn.nonlinear = _bn_relu(init_channels)
        channels = init_channels
        for i, (layers, kernel, dilation) in enumerate(zip((12, 24, 16), (3, 3, 3), (1, 2, 2)), start=1):
            block = nn.Module()
            for j in range(layers):
                block.add_module(f"tdnnd{j + 1}", _DenseLayer(channels + j * growth_rate, growth_rate,
                                                              bn_size * growth_rate, kernel, dilation))
            x.add_module(f"block{i}", block)
            channels += layers * growth_rate
            x.add_module(f"transit{i}", _Transit(channels, channels // 2))
            channels //= 2
        x.out_nonlinear = _bn_relu(channels)
        x.dense = nn.Module()
        x.dense.linear = nn.Conv1d(channels * 2, embedding_size, 1, bias=False)
        x.dense.nonlinear = nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(embedding_size, affine=False)))
        self.xvector = x

    def forward(self, wave16: torch.Tensor) -> torch.Tensor:
        """16 kHz [S] -> [1, embedding_size]."""
        feats = kaldi_fbank(wave16)
        feats = feats - feats.mean(dim=0, keepdim=True)
        x, v = self.head(feats.T[None]), self.xvector
        x = v.tdnn.nonlinear(v.tdnn.linear(x))
        for i in (1, 2, 3):
            for layer in getattr(v, f"block{i}").children():          # dense: every layer sees all before it
                x = torch.cat([x, layer(x)], dim=1)
            x = getattr(v, f"transit{i}")(x)
        x = v.out_nonlinear(x)
        stats = torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)
        return v.dense.nonlinear(v.dense.linear(stats[..., None])[..., 0])


# --- voice encoder (Resemble's GE2E-style LSTM) ---------------------------------------------------------
def trim_silence(wave: np.ndarray, top_db: float = 20.0, frame: int = 2048, hop: int = 512) -> np.ndarray:
    """librosa.effects.trim(wave, top_db=20): keep from the first to the last frame whose RMS is within
    top_db of the loudest frame (frames centred, zero-padded)."""
    y = np.pad(wave, (frame // 2, frame // 2))
    frames = np.lib.stride_tricks.sliding_window_view(y, frame)[::hop]
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float32), axis=-1))
    power = np.square(np.abs(rms))
    db = 10.0 * np.log10(np.maximum(1e-10, power)) - 10.0 * np.log10(np.maximum(1e-10, np.max(power)))
    loud = np.flatnonzero(db > -top_db)
    if not loud.size:
        return wave[:0]
    return wave[loud[0] * hop:min(wave.shape[-1], (loud[-1] + 1) * hop)]


class VoiceEncoder(nn.Module):
    """ve.safetensors: 16 kHz speech -> speaker embedding [256] (unit length)."""

    MELS, PARTIAL, STEP = 40, 160, 77     # 160-frame partials every round(16000 / 1.3 / 160) frames (rate 1.3)
    MIN_COVERAGE = 0.8

    def __init__(self, hidden: int = 256, embed: int = 256):
        super().__init__()
        self.lstm = nn.LSTM(self.MELS, hidden, num_layers=3, batch_first=True)
        self.proj = nn.Linear(hidden, embed)
        self.similarity_weight = nn.Parameter(torch.tensor([10.0]))   # training only; loaded all the same
        self.similarity_bias = nn.Parameter(torch.tensor([-5.0]))
        self.register_buffer("mel_basis", torch.from_numpy(mel_filters(S3_RATE, 400, self.MELS, 0.0, 8000.0)),
                             persistent=False)

    def mels(self, wave: np.ndarray) -> torch.Tensor:
        """librosa's centred (reflect) Hann STFT of 400 every 160, power, 40 mels: [S] -> [1 + S // 160, 40].
        The STFT in float64, then complex64, as librosa computes and stores it."""
        y = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float64))
        spec = torch.stft(y, 400, 160, window=torch.hann_window(400, dtype=torch.float64), center=True,
                          pad_mode="reflect", return_complex=True).to(torch.complex64)
        return (self.mel_basis.to(y.device) @ spec.abs() ** 2).T

    def forward(self, wave16: np.ndarray) -> torch.Tensor:
        """[256]: the unit mean of the unit embeddings of overlapping partials (the last one kept if it covers
        at least 80 % of a partial; the mel zero-padded to whole partials)."""
        mel = self.mels(trim_silence(wave16)).to(self.proj.weight.device)
        n, rest = divmod(max(mel.shape[0] - self.PARTIAL + self.STEP, 0), self.STEP)
        if n == 0 or (rest + self.PARTIAL - self.STEP) / self.PARTIAL >= self.MIN_COVERAGE:
            n += 1
        target = self.PARTIAL + self.STEP * (n - 1)
        mel = F.pad(mel, (0, 0, 0, max(target - mel.shape[0], 0)))[:target]
        partials = torch.stack([mel[i * self.STEP:i * self.STEP + self.PARTIAL] for i in range(n)])
        _, (hidden, _) = self.lstm(partials)
        embeds = F.relu(self.proj(hidden[-1]))
        embeds = embeds / torch.linalg.norm(embeds, dim=1, keepdim=True)
        mean = embeds.mean(dim=0)
        return mean / torch.linalg.norm(mean)


def ffmpeg_resample(wave: np.ndarray, orig: int, new: int) -> np.ndarray:
    """FFmpeg's resampler (PyAV), float in and out: what decoding the clip at `new` gives."""
    import av

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(wave, dtype=np.float32).reshape(1, -1), format="flt",
                                       layout="mono")
    frame.sample_rate = orig
    resampler = av.AudioResampler(format="flt", layout="mono", rate=new)
    chunks = [f.to_ndarray().reshape(-1) for f in [*resampler.resample(frame), *resampler.resample(None)]]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


# --- all of it -----------------------------------------------------------------------------------------
class VoiceCloner:
    """The S3 tokenizer and x-vector encoder of s3gen.safetensors and the voice encoder (ve.safetensors),
    float32 on the CPU. Sizes from config.json's `s3gen.tokenizer` / `s3gen.xvector` (release sizes otherwise)."""

    rate = S3GEN_RATE

    def __init__(self, folder: str | Path):
        from safetensors import safe_open
        from safetensors.torch import load_file

        folder = Path(folder)
        sizes = read_config(folder).get("s3gen", {})
        self.tokenizer = S3Tokenizer(**sizes.get("tokenizer", {}))
        self.xvector = CAMPPlus(**sizes.get("xvector", {}))
        with safe_open(str(folder / "s3gen.safetensors"), framework="pt") as f:
            keys = set(f.keys())
            for prefix, module in (("tokenizer.", self.tokenizer), ("speaker_encoder.", self.xvector)):
                names = module.state_dict().keys()
                missing = [n for n in names if prefix + n not in keys]
                if missing:
                    raise ValueError(f"{folder}/s3gen.safetensors: no {prefix}{missing[0]} (and {len(missing) - 1} "
                                     "more): voice cloning needs the S3 tokenizer and x-vector weights")
                module.load_state_dict({n: f.get_tensor(prefix + n) for n in names})
        self.voice_encoder = VoiceEncoder()
        self.voice_encoder.load_state_dict(load_file(str(folder / "ve.safetensors")))
        for m in (self.tokenizer, self.xvector, self.voice_encoder):
            m.float().eval()

    @torch.inference_mode()
    def s3gen_reference(self, wave24: torch.Tensor) -> dict:
        """S3Gen.embed_ref of a 24 kHz clip (already cut to 10 s): the reference dict its flow reads."""
        mel = s3gen_mel(wave24)
        wave16 = resample(wave24, S3GEN_RATE, S3_RATE)
        tokens = self.tokenizer(wave16)
        if mel.shape[1] != 2 * tokens.shape[0]:        # the package cuts the tokens to the mel's length
            tokens = tokens[:mel.shape[1] // 2]
        return {"prompt_token": tokens[None], "prompt_token_len": torch.tensor([tokens.shape[0]]),
                "prompt_feat": mel, "prompt_feat_len": None, "embedding": self.xvector(wave16)}

    @torch.inference_mode()
    def t3_voice(self, wave16: torch.Tensor) -> Voice:
        """T3's conditioning from the 16 kHz clip: speaker embedding [1, 256], prompt tokens [1, <= 150]."""
        tokens = self.tokenizer(wave16[:T3_CLIP_SECONDS * S3_RATE], max_tokens=T3_PROMPT_TOKENS)
        return Voice(self.voice_encoder(wave16.numpy())[None], tokens[None])

    def clone(self, wave24: np.ndarray, wave16: np.ndarray | None = None) -> tuple[Voice, dict]:
        """A 24 kHz mono clip -> (T3's voice, S3Gen's reference), as prepare_conditionals computes them.
        `wave16`: T3's 16 kHz clip, when given (else FFmpeg's resampling of wave24)."""
        wave = torch.from_numpy(np.ascontiguousarray(wave24, dtype=np.float32))
        ref = self.s3gen_reference(wave[:S3GEN_CLIP_SECONDS * S3GEN_RATE])
        if wave16 is None:
            wave16 = ffmpeg_resample(wave24, S3GEN_RATE, S3_RATE)
        return self.t3_voice(torch.from_numpy(np.ascontiguousarray(wave16, dtype=np.float32))), ref
