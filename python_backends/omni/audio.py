"""Qwen3-Omni's audio tower (transformers' `Qwen3OmniMoeAudioEncoder`, `thinker.audio_tower.*`) over a packed
batch: the shared Qwen3 audio tower (encoders/qwen3_audio.py) and the thinker's own output map, proj1 ->
GELU -> proj2 into the thinker's width.

Features are the processor's: `WhisperFeatureExtractor` with padding=True and no truncation, i.e. each
clip's own log-mel frames (samples // 160 of them) and no minimum length, which is what
encoders/whisper.py computes per clip; a prompt takes `encoder_frames(frames)` audio tokens
(`_get_feat_extract_output_lengths`). Each clip's rows equal transformers' on that clip alone
(tests/test_omni_parity.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.encoders.qwen3_audio import (AudioTower, Qwen3AudioConfig, chunked_features, encoder_frames,
                                              tower_mel_filters)
from triton_omni.encoders.whisper import WHISPER_FFT, whisper_frames
from triton_omni.models.loader import load_weights

MODEL_TYPE = "qwen3_omni_moe"
MIN_SAMPLES = WHISPER_FFT + 1        # the centred STFT's reflect padding needs more than half a window


def audio_tokens(samples: int, config: Qwen3AudioConfig) -> int:
    """Placeholder tokens a clip of `samples` samples (16 kHz) takes in the prompt."""
    return encoder_frames(whisper_frames(samples), config)


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

    def forward(self, clips: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """-> (embeddings [T, output_dim] of every clip one after another, each clip's count T_i)."""
        tower = self.audio_tower
        x, counts = tower.encode(*chunked_features(clips, self.mel_filters, self.config), lone_short_chunks=True)
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
        model = model.to_empty(device="cpu")
        model.audio_tower.reset_buffers()
        model.mel_filters.copy_(tower_mel_filters(config))
        load_weights(model, folder)
        model = model.to(device=device)
        for p in model.parameters():
            p.data = p.data.to(dtype)
        return model.eval()
