"""Whisper's log-mel spectrogram (WhisperFeatureExtractor's maths), batched over a set of clips on the
device: the features of the Qwen3 audio tower (Qwen3-ASR, Qwen3-Omni) and of Whisper towers."""
from __future__ import annotations

import torch

WHISPER_FFT, WHISPER_HOP = 400, 160      # 25 ms windows every 10 ms at 16 kHz


def whisper_frames(samples: int) -> int:
    """Frames of a clip's log-mel spectrogram alone (torch.stft, centred, its last frame dropped)."""
    return samples // WHISPER_HOP


def whisper_log_mel(clips: list[torch.Tensor], filters: torch.Tensor, padded: bool = False,
                    extra: int = 0) -> torch.Tensor:
    """Whisper's log-mel spectrogram (Qwen3ASRFeatureExtractor, WhisperFeatureExtractor) of each clip
    alone: torch.stft centred with reflect padding at both ends (Hann window, 400-sample FFT, 160-sample
    hop), its last frame dropped, power through the mel filters `filters` [mels, 201], log10 clamped to
    8 below the clip's maximum, scaled (x + 4) / 4. -> [mels, sum of whisper_frames(len)] float32.

    Packed, not padded to the longest: each clip (with its reflected ends) sits in a slot of the buffer
    that is a whole number of hops long, so one strided view holds every clip's frames: one FFT, one
    mel product and one per-clip maximum for all clips of a batch.

    `padded`: the clip as the Whisper feature extractor sees it, zero-padded to 30 s: zeros after it (no
    reflection), ceil(len / 160) frames and `extra` more (which overlap the clip's end or are silence),
    the maximum over all of them (the padded frames after those are silence and never the maximum)."""
    device, half = clips[0].device, WHISPER_FFT // 2
    frames = [(-(-c.numel() // WHISPER_HOP) + extra) if padded else whisper_frames(c.numel()) for c in clips]
    slots = [-(-(n * WHISPER_HOP + WHISPER_FFT) // WHISPER_HOP) * WHISPER_HOP for n in frames]
    buffer = torch.zeros(sum(slots), dtype=torch.float32, device=device)
    starts, at = [], 0
    for clip, slot in zip(clips, slots):
        clip = clip.float().reshape(-1)
        if clip.numel() <= half:
            raise ValueError(f"a clip of {clip.numel()} samples is too short for a {WHISPER_FFT}-sample window")
        tail = clip.new_zeros(0) if padded else clip[-half - 1:-1].flip(0)
        body = torch.cat([clip[1:half + 1].flip(0), clip, tail])[:slot]
        buffer[at:at + body.numel()] = body
        starts.append(at // WHISPER_HOP)
        at += slot
    windows = buffer.unfold(0, WHISPER_FFT, WHISPER_HOP)          # [hops, 400], a view
    index = torch.cat([torch.arange(n, device=device) + s for s, n in zip(starts, frames)])
    spectrum = torch.fft.rfft(windows.index_select(0, index) * torch.hann_window(WHISPER_FFT, device=device), dim=-1)
    mel = filters.to(device=device, dtype=torch.float32) @ (spectrum.abs() ** 2).T     # [mels, frames]
    log = torch.clamp(mel, min=1e-10).log10()
    owner = torch.repeat_interleave(torch.arange(len(clips), device=device), torch.tensor(frames, device=device))
    peak = torch.full((len(clips),), -torch.inf, device=device).scatter_reduce(0, owner, log.amax(0), "amax")
    return (torch.maximum(log, (peak - 8.0)[owner]) + 4.0) / 4.0
