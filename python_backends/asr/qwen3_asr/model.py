"""Qwen3-ASR's audio encoder (transformers' `Qwen3ASREncoder`) and projector, over a packed batch: every
clip of every request in one call, no padding to the longest.

The encoder (the reference, per clip): the log-mel spectrogram (128 bins, 10 ms frames) is cut into
chunks of 2 * n_window frames (1 s; the last one zero-padded), each chunk runs alone through three
stride-2 3x3 convs and a linear map (13 frames of 80 ms a chunk) plus a sinusoidal position table
restarting at each chunk; the valid frames of all chunks form one sequence per clip, and attention
runs within windows of n_window_infer / (2 n_window) chunks (8 s at the release's 800 frames). A
projector (linear, GELU, linear) maps the frames into the decoder's width.

Packed here: the chunks of all clips are one conv batch (every chunk is the same size, so this is no
padding beyond the model's own), the valid frames one [T, d] tensor, and the windows of all clips one
list of variable-length sequences for asr/attention.py. Each clip's outputs equal transformers' on that
clip alone (tests/test_asr_llm_parity.py).

The tower itself is encoders/qwen3_audio.py's (Qwen3-Omni's audio tower is the same); this module adds the
0.5 s minimum of Qwen3-ASR's feature extractor and its projector.

Checkpoints: a Hugging Face folder of `Qwen3ASRForConditionalGeneration` (model_type qwen3_asr); the
encoder reads `model.audio_tower.*` and `model.multi_modal_projector.*` (the decoder is models/qwen3.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.encoders.qwen3_audio import (CHUNK_FRAMES_AFTER_CNN, AudioTower, EncoderLayer,  # noqa: F401
                                              Qwen3AudioConfig, after_cnn, chunked_features, encoder_frames,
                                              materialize_tower, sinusoids, tower_mel_filters)
from triton_omni.encoders.whisper import whisper_frames

# the tower is encoders/qwen3_audio.py's (Qwen3-Omni's audio tower is the same); the names stay importable here
Qwen3ASREncoderConfig = Qwen3AudioConfig

MIN_SAMPLES = 8000      # the feature extractor zero-pads shorter clips to 0.5 s (as the release library)


def audio_tokens(samples: int, config: Qwen3ASREncoderConfig) -> int:
    """Placeholder tokens a clip of `samples` samples (16 kHz) takes in the prompt."""
    return encoder_frames(whisper_frames(max(samples, MIN_SAMPLES)), config)


class Projector(nn.Module):
    def __init__(self, c: Qwen3ASREncoderConfig):
        super().__init__()
        self.linear_1 = nn.Linear(c.d_model, c.d_model)
        self.linear_2 = nn.Linear(c.d_model, c.output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(x)))


class Qwen3ASRAudioEncoder(nn.Module):
    """Clips (16 kHz float) -> each clip's prompt embeddings, packed [sum of audio_tokens, output_dim]."""

    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2)}
    rename = {"model.audio_tower.": "audio_tower.", "model.multi_modal_projector.": "multi_modal_projector."}
    skip_prefixes = ("model.language_model.", "lm_head.")

    def __init__(self, config: Qwen3ASREncoderConfig):
        super().__init__()
        self.config = config
        self.audio_tower = AudioTower(config)
        self.multi_modal_projector = Projector(config)
        self.register_buffer("mel_filters", tower_mel_filters(config), persistent=False)

    def features(self, clips: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """The clips' log-mel frames, each padded with zeros to whole chunks: [chunks, 1, mels, chunk], and
        each clip's count of real frames."""
        clips = [F.pad(x, (0, MIN_SAMPLES - x.numel())) if x.numel() < MIN_SAMPLES else x for x in clips]
        return chunked_features(clips, self.mel_filters, self.config)

    def forward(self, clips: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """-> (embeddings [T, output_dim] of every clip one after another, each clip's count T_i)."""
        x, counts = self.audio_tower.encode(*self.features(clips))
        return self.multi_modal_projector(x), counts

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "Qwen3ASRAudioEncoder":
        raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        if raw.get("model_type") != "qwen3_asr":
            raise ValueError(f"{folder}/config.json: model_type {raw.get('model_type')!r}; expected 'qwen3_asr'")
        audio = dict(raw.get("audio_config") or {})
        config = Qwen3ASREncoderConfig.from_dict(audio)
        with torch.device("meta"):
            model = cls(config)
        return materialize_tower(model, config, folder, device, dtype)
