"""Signal processing that speech models share: librosa's Slaney mel filter bank and torchaudio's sinc
resampling, rebuilt in numpy / torch so that serving needs neither package."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    mel = f / (200.0 / 3)
    log = f >= 1000.0
    return np.where(log, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), m * 200.0 / 3)


def mel_filters(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """librosa.filters.mel(sr=, n_fft=, n_mels=, fmin=, fmax=) (Slaney scale and area norm): [n_mels, 1 + n_fft/2]."""
    freqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - freqs[None, :]
    lower, upper = -ramps[:-2] / widths[:-1, None], ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights.astype(np.float32)


def resample(wave: torch.Tensor, orig: int, new: int, zeros: int = 6, rolloff: float = 0.99) -> torch.Tensor:
    """torchaudio.functional.resample with its defaults (a Hann-windowed sinc over `zeros` zero crossings,
    cut off at `rolloff` of the lower Nyquist rate), which the OmniVoice and Fish S2 releases use for a
    reference clip's rate (OmniVoice inside its codec too: 24 kHz -> HuBERT's 16 kHz). The kernel is computed in the wave's dtype in the same
    order, so the samples are torchaudio's. wave [..., S] -> [..., ceil(S * new / orig)]."""
    if orig == new:
        return wave
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    cutoff = min(orig, new) * rolloff
    width = math.ceil(zeros * orig / cutoff)            # input samples each side of an output sample
    dt, dev = wave.dtype, wave.device
    offsets = torch.arange(-width, width + orig, dtype=dt, device=dev)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=dt, device=dev)[:, None, None] / new + offsets   # [new, 1, taps]
    t = (t * cutoff).clamp(-zeros, zeros)
    window = torch.cos(t * math.pi / zeros / 2) ** 2
    t = t * math.pi
    kernel = torch.where(t == 0, torch.tensor(1.0, dtype=dt, device=dev), t.sin() / t) * (window * (cutoff / orig))
    shape = wave.shape
    x = F.pad(wave.reshape(-1, shape[-1]), (width, width + orig))
    out = F.conv1d(x[:, None], kernel, stride=orig).transpose(1, 2).reshape(x.shape[0], -1)
    return out[:, :math.ceil(new * shape[-1] / orig)].reshape(*shape[:-1], -1)
