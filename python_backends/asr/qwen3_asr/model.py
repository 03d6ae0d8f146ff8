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

Checkpoints: a Hugging Face folder of `Qwen3ASRForConditionalGeneration` (model_type qwen3_asr); the
encoder reads `model.audio_tower.*` and `model.multi_modal_projector.*` (the decoder is models/qwen3.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.asr.attention import packed_attention
from triton_omni.asr.features import whisper_frames, whisper_log_mel
from triton_omni.media.audio_signal import mel_filters
from triton_omni.models.layers import MergedLinear
from triton_omni.models.loader import load_weights

CHUNK_FRAMES_AFTER_CNN = 13          # frames of one full chunk after the three stride-2 convs


@dataclass(frozen=True)
class Qwen3ASREncoderConfig:
    """The checkpoint's `audio_config` (Qwen3ASREncoderConfig), the keys the encoder reads, and the
    projector's output width (`output_dim`, the decoder's hidden size)."""

    num_mel_bins: int = 128
    d_model: int = 1024
    encoder_layers: int = 24
    encoder_attention_heads: int = 16
    encoder_ffn_dim: int = 4096
    n_window: int = 50
    n_window_infer: int = 800
    downsample_hidden_size: int = 480
    output_dim: int = 2048
    max_position_embeddings: int = 13
    activation_function: str = "gelu"

    @classmethod
    def from_dict(cls, raw: dict) -> "Qwen3ASREncoderConfig":
        config = cls(**{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})
        if config.activation_function != "gelu":
            raise ValueError(f"audio_config.activation_function {config.activation_function!r}: only 'gelu' is implemented")
        if config.n_window_infer % (2 * config.n_window):
            raise ValueError("audio_config.n_window_infer must be a multiple of 2 * n_window")
        return config

    @property
    def chunk(self) -> int:
        """Mel frames per conv chunk."""
        return 2 * self.n_window

    @property
    def window(self) -> int:
        """Encoder frames per attention window (after the convs)."""
        return CHUNK_FRAMES_AFTER_CNN * (self.n_window_infer // self.chunk)


def after_cnn(frames: int) -> int:
    """Frames of a chunk of `frames` mel frames after the three (kernel 3, stride 2, padding 1) convs."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


def encoder_frames(mel_frames: int, config: Qwen3ASREncoderConfig) -> int:
    """Encoder outputs (= audio placeholder tokens of the prompt) of a clip of `mel_frames` frames."""
    full, rest = divmod(mel_frames, config.chunk)
    return full * after_cnn(config.chunk) + after_cnn(rest)


MIN_SAMPLES = 8000      # the feature extractor zero-pads shorter clips to 0.5 s (as the release library)


def audio_tokens(samples: int, config: Qwen3ASREncoderConfig) -> int:
    """Placeholder tokens a clip of `samples` samples (16 kHz) takes in the prompt."""
    return encoder_frames(whisper_frames(max(samples, MIN_SAMPLES)), config)


class EncoderLayer(nn.Module):
    """Pre-norm transformer layer (Qwen3OmniMoeAudioEncoderLayer): attention within each window, GELU MLP."""

    def __init__(self, c: Qwen3ASREncoderConfig):
        super().__init__()
        self.heads, self.head_dim = c.encoder_attention_heads, c.d_model // c.encoder_attention_heads
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = MergedLinear(c.d_model, [c.d_model] * 3, bias=True)
        self.self_attn.out_proj = nn.Linear(c.d_model, c.d_model)
        self.self_attn_layer_norm = nn.LayerNorm(c.d_model)
        self.fc1 = nn.Linear(c.d_model, c.encoder_ffn_dim)
        self.fc2 = nn.Linear(c.encoder_ffn_dim, c.d_model)
        self.final_layer_norm = nn.LayerNorm(c.d_model)

    def forward(self, x: torch.Tensor, cu: torch.Tensor, lens: list[int], longest: int) -> torch.Tensor:
        qkv = F.linear(self.self_attn_layer_norm(x), self.self_attn.qkv_proj.weight, self.self_attn.qkv_proj.bias)
        q, k, v = qkv.view(x.shape[0], 3, self.heads, self.head_dim).unbind(1)
        a = packed_attention(q, k, v, cu, lens, longest, self.head_dim ** -0.5)
        x = x + self.self_attn.out_proj(a.reshape(x.shape[0], -1))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """The encoder's position table (SinusoidsPositionEmbedding): sin then cos of log-spaced rates."""
    increment = np.log(max_timescale) / (channels // 2 - 1)
    rates = torch.exp(-increment * torch.arange(channels // 2).float())
    t = torch.arange(length)[:, None] * rates[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class AudioTower(nn.Module):
    def __init__(self, c: Qwen3ASREncoderConfig):
        super().__init__()
        ch = c.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, ch, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        freq = after_cnn(c.num_mel_bins)
        self.conv_out = nn.Linear(ch * freq, c.d_model, bias=False)
        self.register_buffer("positions", sinusoids(c.max_position_embeddings, c.d_model), persistent=False)
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.ln_post = nn.LayerNorm(c.d_model)


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
        self.register_buffer("mel_filters", torch.from_numpy(mel_filters(16000, 400, config.num_mel_bins, 0.0, 8000.0)),
                             persistent=False)

    def features(self, clips: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """The clips' log-mel frames, each padded with zeros to whole chunks: [chunks, 1, mels, chunk], and
        each clip's count of real frames."""
        c = self.config
        clips = [F.pad(x, (0, MIN_SAMPLES - x.numel())) if x.numel() < MIN_SAMPLES else x for x in clips]
        mel = whisper_log_mel(clips, self.mel_filters)
        frames = [whisper_frames(x.numel()) for x in clips]
        chunks = [-(-n // c.chunk) for n in frames]
        padded = mel.new_zeros((c.num_mel_bins, sum(chunks) * c.chunk))
        where = torch.cat([torch.arange(n) + at * c.chunk for n, at in zip(frames, [0, *np.cumsum(chunks)[:-1]])])
        padded[:, where.to(mel.device)] = mel
        return padded.view(c.num_mel_bins, -1, c.chunk).permute(1, 0, 2)[:, None], frames

    def forward(self, clips: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """-> (embeddings [T, output_dim] of every clip one after another, each clip's count T_i)."""
        c, tower = self.config, self.audio_tower
        dtype = tower.conv2d1.weight.dtype
        chunks, frames = self.features(clips)
        x = F.gelu(tower.conv2d1(chunks.to(dtype)))
        x = F.gelu(tower.conv2d2(x))
        x = F.gelu(tower.conv2d3(x))                                   # [chunks, ch, freq, 13]
        n, ch, freq, t = x.shape
        x = tower.conv_out(x.permute(0, 3, 1, 2).reshape(n, t, ch * freq)) + tower.positions[:t].to(dtype)
        # each chunk's valid frames (a clip's last chunk has fewer), in order: one packed sequence
        valid = []
        for m in frames:
            full, rest = divmod(m, c.chunk)
            valid += [after_cnn(c.chunk)] * full + ([after_cnn(rest)] if rest else [])
        keep = torch.cat([torch.arange(v) + i * t for i, v in enumerate(valid)]).to(x.device)
        x = x.reshape(n * t, -1).index_select(0, keep)
        counts = [encoder_frames(m, c) for m in frames]
        windows = [w for m in counts for w in [c.window] * (m // c.window) + ([m % c.window] if m % c.window else [])]
        cu = torch.tensor([0, *windows], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(x.device)
        for layer in tower.layers:
            x = layer(x, cu, windows, max(windows))
        return self.multi_modal_projector(tower.ln_post(x)), counts

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "Qwen3ASRAudioEncoder":
        raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        if raw.get("model_type") != "qwen3_asr":
            raise ValueError(f"{folder}/config.json: model_type {raw.get('model_type')!r}; expected 'qwen3_asr'")
        audio = dict(raw.get("audio_config") or {})
        config = Qwen3ASREncoderConfig.from_dict(audio)
        with torch.device("meta"):
            model = cls(config)
        model = model.to_empty(device="cpu")
        model.audio_tower.positions.copy_(sinusoids(config.max_position_embeddings, config.d_model))
        model.mel_filters.copy_(torch.from_numpy(mel_filters(16000, 400, config.num_mel_bins, 0.0, 8000.0)))
        load_weights(model, folder)
        model = model.to(device=device)
        for p in model.parameters():
            p.data = p.data.to(dtype)
        return model.eval()
