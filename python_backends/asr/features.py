"""Feature extraction that speech encoders share, batched over a request set's clips on the device.

Wav2vec2-style encoders (Omnilingual ASR) read the waveform itself, normalised per clip; mel-spectrogram
encoders (Whisper-like, Qwen3-ASR) would add their filter bank here (media/audio_signal.py has the mel
filters), computed on the same packed clips.
"""
from __future__ import annotations

import torch


def normalize_clips(clips: list[torch.Tensor], eps: float = 1e-5) -> list[torch.Tensor]:
    """The feature extractor (OmniASRFeatureExtractor, do_normalize): each clip to zero mean and unit
    variance over its own samples (biased variance, `eps` inside the root, as layer_norm), in float32.
    On the clips' device, all clips in a few batched ops."""
    lengths = torch.tensor([c.numel() for c in clips], device=clips[0].device)
    flat = torch.cat(clips).float()
    owner = torch.repeat_interleave(torch.arange(len(clips), device=flat.device), lengths)
    n = lengths.to(flat.dtype)
    mean = torch.zeros(len(clips), device=flat.device).index_add_(0, owner, flat) / n
    centred = flat - mean[owner]
    var = torch.zeros(len(clips), device=flat.device).index_add_(0, owner, centred * centred) / n
    return list((centred / torch.sqrt(var + eps)[owner]).split(lengths.tolist()))


# Whisper's features live in encoders/whisper.py (shared with the omni family); kept here for importers
from triton_omni.encoders.whisper import WHISPER_FFT, WHISPER_HOP, whisper_frames, whisper_log_mel  # noqa: E402,F401
