"""Qwen3-Omni's audio tower (transformers' `Qwen3OmniMoeAudioEncoder`, `thinker.audio_tower.*`) over a packed
batch: the shared Qwen3 audio tower (encoders/qwen3_audio.py) and the thinker's own output map, proj1 ->
GELU -> proj2 into the thinker's width.

Features are the processor's: `WhisperFeatureExtractor` with padding=True and no truncation over a
request's clips together (`request_layout`): every clip zero-padded to the request's longest, its log-mel
spectrogram taken over the padded row (so its maximum too), the frames its attention mask keeps
(ceil(samples / 160), at most the longest's samples // 160), and the model's conv chunks padded to the
request's longest chunk. A clip's prompt takes `encoder_frames(frames)` audio tokens
(`_get_feat_extract_output_lengths`). Each request's rows equal transformers' on that request's clips,
whatever else shares the forward (tests/test_omni_parity.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.encoders.qwen3_audio import (AudioTower, Qwen3AudioConfig, chunk_mel, encoder_frames,
                                              materialize_tower, tower_mel_filters)
from triton_omni.encoders.whisper import WHISPER_FFT, WHISPER_HOP, whisper_log_mel

MODEL_TYPE = "qwen3_omni_moe"
MIN_SAMPLES = WHISPER_FFT + 1        # the centred STFT's reflect padding needs more than half a window


@dataclass(frozen=True)
class ClipLayout:
    """How the processor and the tower's reference see one clip of a request."""
    frames: int         # log-mel frames kept (the feature extractor's attention mask)
    padded_to: int      # samples: the clip zero-padded to the request's longest clip
    chunk_pad: int      # the length every conv chunk of the request is padded to


def request_layout(lengths: list[int], config: Qwen3AudioConfig) -> list[ClipLayout]:
    """Each clip's layout, for the clips (samples, 16 kHz) of one request."""
    longest = max(lengths, default=0)
    total = longest // WHISPER_HOP            # frames of the padded batch (its last frame dropped)
    frames = [min(-(-n // WHISPER_HOP), total) for n in lengths]     # the mask: one per hop the clip reaches
    chunk = max((config.chunk if f >= config.chunk else f for f in frames), default=config.chunk)
    return [ClipLayout(f, longest, chunk) for f in frames]


def audio_tokens(lengths: list[int], config: Qwen3AudioConfig) -> list[int]:
    """Placeholder tokens each clip of a request (samples, 16 kHz) takes in the prompt."""
    return [encoder_frames(c.frames, config) for c in request_layout(lengths, config)]


def thinker_config(folder: str | Path) -> dict:
    """config.json's thinker_config (checked to be a Qwen3-Omni checkpoint)."""
    raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    if raw.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{folder}/config.json: model_type {raw.get('model_type')!r}; expected {MODEL_TYPE!r}")
    return raw.get("thinker_config") or {}


class OmniAudioTower(AudioTower):
    def __init__(self, c: Qwen3AudioConfig):
        super().__init__(c)
        self.proj1 = nn.Linear(c.d_model, c.d_model)
        self.proj2 = nn.Linear(c.d_model, c.output_dim)


class Qwen3OmniAudioEncoder(nn.Module):
    """Clips (16 kHz float) -> each clip's prompt embeddings, packed [sum of audio_tokens, output_dim]."""

    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2)}
    rename = {"thinker.audio_tower.": "audio_tower."}
    skip_prefixes = ("thinker.model.", "thinker.lm_head.", "thinker.visual.", "talker.", "code2wav.")

    def __init__(self, config: Qwen3AudioConfig):
        super().__init__()
        self.config = config
        self.audio_tower = OmniAudioTower(config)
        self.register_buffer("mel_filters", tower_mel_filters(config), persistent=False)

    def features(self, clips: list[torch.Tensor], layouts: list[ClipLayout]) -> torch.Tensor:
        """The clips' log-mel frames [mels, sum of frames]: each clip zero-padded to its request's longest, its
        spectrogram (the maximum over the padded row, as the extractor takes it), the masked frames kept."""
        padded = [F.pad(x, (0, c.padded_to - x.numel())) for x, c in zip(clips, layouts)]
        mel = whisper_log_mel(padded, self.mel_filters)
        rows = mel.split([c.padded_to // WHISPER_HOP for c in layouts], dim=1)
        return torch.cat([m[:, :c.frames] for m, c in zip(rows, layouts)], dim=1)

    def forward(self, clips: list[torch.Tensor], layouts: list[ClipLayout] | None = None
                ) -> tuple[torch.Tensor, list[int]]:
        """-> (embeddings [T, output_dim] of every clip one after another, each clip's count T_i). `layouts`:
        each clip's (request_layout of its request's clips); None: every clip a request of its own."""
        layouts = layouts or [request_layout([c.numel()], self.config)[0] for c in clips]
        frames = [c.frames for c in layouts]
        chunks = chunk_mel(self.features(clips, layouts), frames, self.config)
        tower = self.audio_tower
        x, counts = tower.encode(chunks, frames, [c.chunk_pad for c in layouts])
        return tower.proj2(F.gelu(tower.proj1(x))), counts

    @classmethod
    def build(cls, folder: str | Path) -> "Qwen3OmniAudioEncoder":
        """The tower of the checkpoint's config, uninitialised (on the current default device)."""
        return cls(Qwen3AudioConfig.from_dict(dict(thinker_config(folder).get("audio_config") or {})))

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "Qwen3OmniAudioEncoder":
        with torch.device("meta"):
            model = cls.build(folder)
        config = model.config
        return materialize_tower(model, config, folder, device, dtype)
