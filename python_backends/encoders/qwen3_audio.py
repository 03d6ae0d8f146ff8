"""The Qwen3 audio tower (transformers' `Qwen3OmniMoeAudioEncoder`; Qwen3-ASR's `Qwen3ASREncoder` is the same
tower) over a packed batch: every clip of every request in one call, no padding to the longest.

The tower (the reference, per clip): the log-mel spectrogram (128 bins, 10 ms frames) is cut into chunks
of 2 * n_window frames (1 s; the last one zero-padded), each chunk runs alone through three stride-2 3x3
convs and a linear map (13 frames of 80 ms a chunk) plus a sinusoidal position table restarting at each
chunk; the valid frames of all chunks form one sequence per clip, and attention runs within windows of
n_window_infer / (2 n_window) chunks (8 s at the release's 800 frames), then a final LayerNorm. What
maps the frames into the decoder's width differs: Qwen3-ASR's projector (multi_modal_projector), Qwen3-
Omni's proj1 / GELU / proj2 inside the tower; each family adds its own.

Packed here: the chunks of all clips are one conv batch (every chunk is the same size, so this is no
padding beyond the model's own: a conv's own zero padding reads the same zeros), the valid frames one
[T, d] tensor, and the windows of all clips one list of variable-length sequences (encoders/attention.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.encoders.attention import packed_attention
from triton_omni.encoders.whisper import whisper_frames, whisper_log_mel
from triton_omni.media.audio_signal import mel_filters
from triton_omni.models.layers import MergedLinear
from triton_omni.models.loader import load_weights

CHUNK_FRAMES_AFTER_CNN = 13          # frames of one full chunk after the three stride-2 convs
RATE = 16000


@dataclass(frozen=True)
class Qwen3AudioConfig:
    """The checkpoint's `audio_config` (Qwen3ASREncoderConfig, Qwen3OmniMoeAudioEncoderConfig), the keys the
    tower reads, and the output width (`output_dim`, the decoder's hidden size)."""

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
    def from_dict(cls, raw: dict) -> "Qwen3AudioConfig":
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


def encoder_frames(mel_frames: int, config: Qwen3AudioConfig) -> int:
    """Encoder outputs (= audio placeholder tokens of the prompt) of a clip of `mel_frames` frames
    (transformers' `_get_feat_extract_output_lengths`)."""
    full, rest = divmod(mel_frames, config.chunk)
    return full * after_cnn(config.chunk) + after_cnn(rest)


class EncoderLayer(nn.Module):
    """Pre-norm transformer layer (Qwen3OmniMoeAudioEncoderLayer): attention within each window, GELU MLP."""

    def __init__(self, c: Qwen3AudioConfig):
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


def tower_mel_filters(config: Qwen3AudioConfig) -> torch.Tensor:
    return torch.from_numpy(mel_filters(RATE, 400, config.num_mel_bins, 0.0, 8000.0))


def materialize_tower(model: nn.Module, config: Qwen3AudioConfig, folder, device: str, dtype: torch.dtype) -> nn.Module:
    """A model holding `audio_tower` and `mel_filters`, built on the meta device: its buffers made, the
    folder's weights loaded, moved to `device` and `dtype`, in eval mode."""
    model = model.to_empty(device="cpu")
    model.audio_tower.reset_buffers()
    model.mel_filters.copy_(tower_mel_filters(config))
    load_weights(model, folder)
    model = model.to(device=device)
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model.eval()


def chunked_features(clips: list[torch.Tensor], filters: torch.Tensor, config: Qwen3AudioConfig
                     ) -> tuple[torch.Tensor, list[int]]:
    """The clips' log-mel frames, each padded with zeros to whole chunks: [chunks, 1, mels, chunk], and
    each clip's count of real frames."""
    frames = [whisper_frames(x.numel()) for x in clips]
    return chunk_mel(whisper_log_mel(clips, filters), frames, config), frames


def chunk_mel(mel: torch.Tensor, frames: list[int], config: Qwen3AudioConfig) -> torch.Tensor:
    """Log-mel frames [mels, sum of frames] of clips one after another -> [chunks, 1, mels, chunk], each
    clip padded with zeros to whole chunks."""
    c = config
    chunks = [-(-n // c.chunk) for n in frames]
    padded = mel.new_zeros((c.num_mel_bins, sum(chunks) * c.chunk))
    where = torch.cat([torch.arange(n) + at * c.chunk for n, at in zip(frames, [0, *np.cumsum(chunks)[:-1]])])
    padded[:, where.to(mel.device)] = mel
    return padded.view(c.num_mel_bins, -1, c.chunk).permute(1, 0, 2)[:, None]


class AudioTower(nn.Module):
    """Convs, positions, windowed layers and ln_post, under the checkpoint's names (conv2d1, layers, ...)."""

    def __init__(self, c: Qwen3AudioConfig):
        super().__init__()
        self.config = c
        ch = c.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, ch, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        freq = after_cnn(c.num_mel_bins)
        self.conv_out = nn.Linear(ch * freq, c.d_model, bias=False)
        self.register_buffer("positions", sinusoids(CHUNK_FRAMES_AFTER_CNN, c.d_model), persistent=False)
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.ln_post = nn.LayerNorm(c.d_model)

    def reset_buffers(self) -> None:
        """The position table (after building on the meta device)."""
        self.positions.copy_(sinusoids(CHUNK_FRAMES_AFTER_CNN, self.config.d_model))

    def encode(self, chunks: torch.Tensor, frames: list[int], pads: list[int] | None = None
               ) -> tuple[torch.Tensor, list[int]]:
        """chunks [n, 1, mels, chunk] (chunk_mel) -> (ln_post's output [T, d_model] of every clip one after
        another, each clip's count T_i).

        `pads` (per clip): the length the reference pads each of the clip's chunks to, where it is less than
        a chunk (Qwen3-Omni's reference pads a request's chunks to its longest one: a request of clips under
        one chunk has shorter chunks): the conv outputs past each conv's own length of it are zeroed before
        the next conv reads them. None: every chunk a full zero-padded chunk (Qwen3-ASR's reference)."""
        c = self.config
        dtype = self.conv2d1.weight.dtype
        short, at = [], 0              # [chunk index, its padded length after the convs so far]
        for m, pad in zip(frames, pads or [c.chunk] * len(frames)):
            n = -(-m // c.chunk)
            short += [[i, pad] for i in range(at, at + n)] if pad < c.chunk else []
            at += n
        x = chunks.to(dtype)
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            x = F.gelu(conv(x))
            for item in short:            # the chunk's length after this conv (kernel 3, stride 2, padding 1)
                item[1] = (item[1] - 1) // 2 + 1
                x[item[0], :, :, item[1]:] = 0
        # [chunks, ch, freq, 13]
        n, ch, freq, t = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(n, t, ch * freq)) + self.positions[:t].to(dtype)
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
        for layer in self.layers:
            x = layer(x, cu, windows, max(windows))
        return self.ln_post(x), counts
