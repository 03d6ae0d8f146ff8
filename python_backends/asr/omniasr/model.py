"""Omnilingual ASR's audio encoder (transformers' `OmniASRAudioModel`, wav2vec2-style) and CTC head
(`OmniASRForCTC`), over a packed batch: every clip of every request in one forward, no padding.

How the packed forward stays equal to the reference run on each clip alone:
- the conv feature extractor (7 strided convs, 320 samples a frame) runs over one buffer in which
  each clip starts at a multiple of the total stride, so each clip's frames are the frames it has
  alone; the frames that straddle two clips are computed and dropped;
- the positional conv (kernel 128) runs over the clips' frames laid out with zero gaps as wide as
  its kernel between them: each clip sees the zero padding it sees alone;
- attention is block-diagonal (asr/attention.py); everything else acts on one frame at a time.

Checkpoints: a Hugging Face folder of `OmniASRForCTC` (config.json with model_type omniasr_ctc,
model.safetensors), parameter names unchanged (q/k/v projections fused at load).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.asr.attention import packed_attention
from triton_omni.models.layers import MergedLinear
from triton_omni.models.loader import load_weights


@dataclass(frozen=True)
class AudioEncoderConfig:
    """The checkpoint's `audio_config` (OmniASRAudioConfig), the keys the encoder reads."""

    hidden_size: int = 1024
    conv_dim: tuple[int, ...] = (512,) * 7
    conv_kernel: tuple[int, ...] = (10, 3, 3, 3, 3, 2, 2)
    conv_stride: tuple[int, ...] = (5, 2, 2, 2, 2, 2, 2)
    conv_bias: bool = True
    num_attention_heads: int = 16
    num_hidden_layers: int = 24
    num_conv_pos_embeddings: int = 128
    num_conv_pos_embedding_groups: int = 16
    intermediate_size: int = 4096
    layer_norm_eps: float = 1e-5
    hidden_act: str = "gelu"

    @classmethod
    def from_dict(cls, raw: dict) -> "AudioEncoderConfig":
        known = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in cls.__dataclass_fields__}
        config = cls(**known)
        if config.hidden_act != "gelu":
            raise ValueError(f"audio_config.hidden_act {config.hidden_act!r}: only 'gelu' is implemented")
        if not len(config.conv_dim) == len(config.conv_kernel) == len(config.conv_stride):
            raise ValueError("audio_config: conv_dim, conv_kernel and conv_stride differ in length")
        return config

    @property
    def stride(self) -> int:
        """Input samples per output frame."""
        return math.prod(self.conv_stride)

    def frames(self, samples: int) -> int:
        """Output frames of a clip of `samples` samples (0 if it is shorter than one receptive field)."""
        n = samples
        for k, s in zip(self.conv_kernel, self.conv_stride):
            n = (n - k) // s + 1 if n >= k else 0
        return n

    def min_samples(self) -> int:
        """The shortest clip that makes one frame."""
        n = 1
        for k, s in reversed(list(zip(self.conv_kernel, self.conv_stride))):
            n = (n - 1) * s + k
        return n


@dataclass(frozen=True)
class CTCConfig:
    audio: AudioEncoderConfig
    vocab_size: int
    blank_token_id: int = 0

    @classmethod
    def from_folder(cls, folder: str | Path) -> "CTCConfig":
        raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        if raw.get("model_type") != "omniasr_ctc":
            raise ValueError(f"{folder}/config.json: model_type {raw.get('model_type')!r}; expected 'omniasr_ctc'")
        return cls(AudioEncoderConfig.from_dict(raw.get("audio_config") or {}), int(raw["vocab_size"]),
                   int(raw.get("blank_token_id", 0)))


@dataclass
class PackedClips:
    """A batch of clips (16 kHz, normalised) as the encoder lays them out, and where each one's frames go.

    `samples` [S] holds the clips one after another, each starting at a multiple of the conv stack's
    stride; `frame_index` [T] picks each clip's own frames out of the conv stack's output; `cu_frames`
    [N + 1] (device) and `frames` (host) say which rows of the packed [T, hidden] states are whose."""

    samples: torch.Tensor
    frame_index: torch.Tensor
    frames: list[int]
    cu_frames: torch.Tensor

    @classmethod
    def build(cls, clips: list[torch.Tensor], config: AudioEncoderConfig) -> "PackedClips":
        stride = config.stride
        device = clips[0].device
        starts, frames, offset = [], [], 0
        for clip in clips:
            n = config.frames(clip.numel())
            if n <= 0:
                raise ValueError(f"a clip of {clip.numel()} samples is shorter than one frame "
                                 f"({config.min_samples()} samples)")
            starts.append(offset)
            frames.append(n)
            offset += -(-clip.numel() // stride) * stride
        samples = torch.zeros(offset, dtype=clips[0].dtype, device=device)
        for start, clip in zip(starts, clips):
            samples[start:start + clip.numel()] = clip
        index = torch.cat([torch.arange(n) + start // stride for start, n in zip(starts, frames)])
        cu = torch.tensor([0, *frames], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return cls(samples, index.to(device), frames, cu.to(device))


class ConvLayer(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int, bias: bool):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, bias=bias)
        self.layer_norm = nn.LayerNorm(cout)     # transformers' default eps (1e-5), over channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return F.gelu(self.layer_norm(x.transpose(-2, -1)).transpose(-2, -1))


class Subsampling(nn.Module):
    """The conv feature extractor and its projection to the model width."""

    def __init__(self, c: AudioEncoderConfig):
        super().__init__()
        dims = (1, *c.conv_dim)
        self.conv_layers = nn.ModuleList(ConvLayer(dims[i], dims[i + 1], c.conv_kernel[i], c.conv_stride[i], c.conv_bias)
                                         for i in range(len(c.conv_dim)))
        self.layer_norm = nn.LayerNorm(c.conv_dim[-1], eps=c.layer_norm_eps)
        self.projection = nn.Linear(c.conv_dim[-1], c.hidden_size)

    def forward(self, samples: torch.Tensor, frame_index: torch.Tensor) -> torch.Tensor:
        """samples [S] (packed, aligned) -> the clips' frames [T, hidden]."""
        x = samples[None, None]
        for layer in self.conv_layers:
            x = layer(x)
        x = x[0].transpose(0, 1).index_select(0, frame_index)
        return self.projection(self.layer_norm(x))


class PositionalConv(nn.Module):
    def __init__(self, c: AudioEncoderConfig):
        super().__init__()
        k = c.num_conv_pos_embeddings
        self.kernel = k
        self.conv = nn.Conv1d(c.hidden_size, c.hidden_size, k, padding=k // 2, groups=c.num_conv_pos_embedding_groups)

    def forward(self, x: torch.Tensor, frames: list[int]) -> torch.Tensor:
        """x [T, hidden] (the clips' frames one after another) + the positional embedding of each clip
        alone: the clips are laid out with `kernel` zero frames between them, convolved once, read back."""
        gap = self.kernel
        starts = torch.tensor([0, *frames[:-1]]).cumsum(0) + gap * torch.arange(len(frames))
        where = torch.cat([torch.arange(n) + s for s, n in zip(starts.tolist(), frames)]).to(x.device)
        spaced = x.new_zeros(sum(frames) + gap * len(frames), x.shape[1])
        spaced.index_copy_(0, where, x)
        pos = self.conv(spaced.T[None])[0, :, :-1]      # the reference drops the conv's last output
        return x + F.gelu(pos.T.index_select(0, where))


class EncoderLayer(nn.Module):
    """Pre-norm transformer layer: self-attention within each clip, GELU feed-forward."""

    def __init__(self, c: AudioEncoderConfig):
        super().__init__()
        self.heads, self.head_dim = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        self.attention = nn.Module()
        self.attention.qkv_proj = MergedLinear(c.hidden_size, [c.hidden_size] * 3, bias=True)
        self.attention.out_proj = nn.Linear(c.hidden_size, c.hidden_size)
        self.layer_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.feed_forward = nn.Module()
        self.feed_forward.intermediate_dense = nn.Linear(c.hidden_size, c.intermediate_size)
        self.feed_forward.output_dense = nn.Linear(c.intermediate_size, c.hidden_size)
        self.final_layer_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def qkv(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.layer_norm(x), self.attention.qkv_proj.weight, self.attention.qkv_proj.bias)

    def out_and_ffn(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = x + self.attention.out_proj(a)
        h = F.gelu(self.feed_forward.intermediate_dense(self.final_layer_norm(x)))
        return x + self.feed_forward.output_dense(h)

    def forward(self, x: torch.Tensor, cu: torch.Tensor, frames: list[int], max_frames: int) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.heads, self.head_dim).unbind(1)
        a = packed_attention(q, k, v, cu, frames, max_frames, self.head_dim ** -0.5)
        return self.out_and_ffn(x, a.reshape(x.shape[0], -1))


class AudioEncoder(nn.Module):
    """`OmniASRAudioModel` (inference): packed clips -> last hidden states [T, hidden]."""

    def __init__(self, c: AudioEncoderConfig):
        super().__init__()
        self.config = c
        self.subsampling = Subsampling(c)
        self.encode_positions = PositionalConv(c)
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.num_hidden_layers))
        self.layer_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def compile_layers(self) -> None:
        """torch.compile each conv layer (its transposes, norm and GELU fused around the conv) and the parts
        of each transformer layer around attention (norms, projections, GELU), for any number of frames
        (dynamic shapes); attention itself stays the varlen kernel."""
        for conv in self.subsampling.conv_layers:
            conv.forward = torch.compile(conv.forward, dynamic=True)
        for layer in self.layers:
            layer.qkv = torch.compile(layer.qkv, dynamic=True)
            layer.out_and_ffn = torch.compile(layer.out_and_ffn, dynamic=True)

    def forward(self, packed: PackedClips) -> torch.Tensor:
        x = self.subsampling(packed.samples, packed.frame_index)
        x = self.encode_positions(x, packed.frames)
        longest = max(packed.frames)
        for layer in self.layers:
            x = layer(x, packed.cu_frames, packed.frames, longest)
        return self.layer_norm(x)


class OmniASRCTC(nn.Module):
    """`OmniASRForCTC`: the encoder and a linear CTC head over the vocabulary."""

    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2)}
    rename = {"model.audio_tower.": "encoder."}

    def __init__(self, config: CTCConfig):
        super().__init__()
        self.config = config
        self.encoder = AudioEncoder(config.audio)
        self.ctc_head = nn.Linear(config.audio.hidden_size, config.vocab_size)

    def forward(self, packed: PackedClips) -> torch.Tensor:
        """-> logits [T, vocab] of every clip's frames."""
        return self.ctc_head(self.encoder(packed))

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "OmniASRCTC":
        config = CTCConfig.from_folder(folder)
        with torch.device("meta"):
            model = cls(config)
        model = model.to_empty(device="cpu")
        load_weights(model, folder)
        return model.to(device=device, dtype=dtype).eval()



class OmniASRLLMEncoder(nn.Module):
    """The audio half of `OmniASRForConditionalGeneration` (Omnilingual ASR's LLM variant): the same
    encoder, then a linear projector into the decoder's width; each clip's frames become its prompt's
    audio embeddings (one placeholder token each). The Llama decoder is models/llama.py's."""

    packed = OmniASRCTC.packed
    rename = {"model.audio_tower.": "encoder.", "model.multi_modal_projector.": "multi_modal_projector."}
    skip_prefixes = ("model.language_model.", "lm_head.")

    def __init__(self, audio: AudioEncoderConfig, text_hidden: int):
        super().__init__()
        self.audio = audio
        self.encoder = AudioEncoder(audio)
        self.multi_modal_projector = nn.Linear(audio.hidden_size, text_hidden)

    def forward(self, packed: PackedClips) -> torch.Tensor:
        """-> [T, text hidden]: every clip's frames' embeddings, one clip after another."""
        return self.multi_modal_projector(self.encoder(packed))

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "OmniASRLLMEncoder":
        raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        if raw.get("model_type") != "omniasr":
            raise ValueError(f"{folder}/config.json: model_type {raw.get('model_type')!r}; expected 'omniasr'")
        text = raw.get("text_config") or {}
        with torch.device("meta"):
            model = cls(AudioEncoderConfig.from_dict(raw.get("audio_config") or {}), int(text.get("hidden_size", 4096)))
        model = model.to_empty(device="cpu")
        load_weights(model, folder)
        return model.to(device=device, dtype=dtype).eval()
