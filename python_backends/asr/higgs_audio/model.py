"""Higgs Audio's audio tower (boson-multimodal's `HiggsAudioEncoder`, a Whisper encoder) and its projector
(`HiggsAudioFeatureProjector`), over a packed batch: every clip of every request in one call.

The reference, per clip: the Whisper log-mel of the clip zero-padded to 30 s (3000 frames), two convs
(kernel 3; the second of stride 2: 20 ms frames), Whisper's learned positions, transformer layers whose
attention sees only the clip's frames (its padding masked), a 2-frame average pool (40 ms) and a layer
norm; the first `(L - 2) // 2 + 1` outputs (L: the clip's frames after the convs) go through the
projector (a linear map into the decoder's width) and replace the prompt's `<|AUDIO|>` token.

Packed here: the clips' mel frames (each with the few padded frames its last conv outputs see) sit in
one buffer, each after a zero column at an odd offset, so one conv call per layer gives every clip's
frames as if alone (the stride-2 conv meets each clip's zero padding where the reference has it); the
frames become one [T, d] tensor with one variable-length attention sequence per clip.

Checkpoints: boson-multimodal's layout (config.json with model_type higgs_audio, its audio_encoder_config
and a Llama text_config; audio_tower.*, audio_encoder_proj.*, the decoder's embed_tokens / layers / norm,
audio_decoder_proj.text_lm_head). A checkpoint without its tower (`skip_audio_tower`: the generation
releases) is refused.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.asr.attention import packed_attention
from triton_omni.asr.features import whisper_log_mel
from triton_omni.media.audio_signal import mel_filters
from triton_omni.models.loader import load_weights

MEL_EXTRA = 4          # padded mel frames after a clip that its last conv outputs read


@dataclass(frozen=True)
class HiggsAudioEncoderConfig:
    """The checkpoint's `audio_encoder_config` (HiggsAudioEncoderConfig), and the decoder's width."""

    num_mel_bins: int = 128
    d_model: int = 1280
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    max_source_positions: int = 1500
    activation_function: str = "gelu"
    scale_embedding: bool = False
    text_hidden: int = 3072

    @classmethod
    def from_folder(cls, folder: str | Path) -> "HiggsAudioEncoderConfig":
        raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        if raw.get("model_type") != "higgs_audio":
            raise ValueError(f"{folder}/config.json: model_type {raw.get('model_type')!r}; expected 'higgs_audio'")
        if raw.get("skip_audio_tower", False):
            raise ValueError(f"{folder}: this Higgs Audio checkpoint has no audio tower (skip_audio_tower: a "
                             "generation release); speech recognition needs one with its Whisper tower")
        enc = raw.get("audio_encoder_config") or {}
        config = cls(**{k: v for k, v in enc.items() if k in cls.__dataclass_fields__ and k != "text_hidden"},
                     text_hidden=int((raw.get("text_config") or {}).get("hidden_size", 3072)))
        if config.activation_function != "gelu" or config.scale_embedding:
            raise ValueError("audio_encoder_config: only gelu and scale_embedding false are implemented")
        return config

    @property
    def max_mel_frames(self) -> int:
        return 2 * self.max_source_positions


def mel_frames(samples: int) -> int:
    """The clip's frames the Whisper feature extractor marks valid (ceil(len / 160))."""
    return -(-samples // 160)


def conv_frames(mel: int) -> int:
    return (mel - 1) // 2 + 1


def audio_tokens(samples: int) -> int:
    """Embeddings (= <|AUDIO|> positions) of a clip of `samples` samples: after the convs and the pool."""
    return (conv_frames(mel_frames(samples)) - 2) // 2 + 1


class WhisperLayer(nn.Module):
    """transformers' WhisperEncoderLayer: pre-norm attention (k without bias) and GELU MLP."""

    def __init__(self, c: HiggsAudioEncoderConfig):
        super().__init__()
        self.heads, self.head_dim = c.encoder_attention_heads, c.d_model // c.encoder_attention_heads
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(c.d_model, c.d_model)
        self.self_attn.k_proj = nn.Linear(c.d_model, c.d_model, bias=False)
        self.self_attn.v_proj = nn.Linear(c.d_model, c.d_model)
        self.self_attn.out_proj = nn.Linear(c.d_model, c.d_model)
        self.self_attn_layer_norm = nn.LayerNorm(c.d_model)
        self.fc1 = nn.Linear(c.d_model, c.encoder_ffn_dim)
        self.fc2 = nn.Linear(c.encoder_ffn_dim, c.d_model)
        self.final_layer_norm = nn.LayerNorm(c.d_model)

    def forward(self, x: torch.Tensor, cu: torch.Tensor, lens: list[int], longest: int) -> torch.Tensor:
        h, attn = self.self_attn_layer_norm(x), self.self_attn
        q, k, v = (p(h).view(x.shape[0], self.heads, self.head_dim) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        a = packed_attention(q, k, v, cu, lens, longest, self.head_dim ** -0.5)
        x = x + self.self_attn.out_proj(a.reshape(x.shape[0], -1))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioTower(nn.Module):
    def __init__(self, c: HiggsAudioEncoderConfig):
        super().__init__()
        self.conv1 = nn.Conv1d(c.num_mel_bins, c.d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(c.d_model, c.d_model, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(c.max_source_positions, c.d_model)
        self.layers = nn.ModuleList(WhisperLayer(c) for _ in range(c.encoder_layers))
        self.layer_norm = nn.LayerNorm(c.d_model)


class Projector(nn.Module):
    def __init__(self, c: HiggsAudioEncoderConfig):
        super().__init__()
        self.linear = nn.Linear(c.d_model, c.text_hidden)


class HiggsAudioEncoder(nn.Module):
    """Clips (16 kHz float, at most 30 s) -> each clip's prompt embeddings, packed [sum of audio_tokens, text_hidden]."""

    # the decoder's and the audio-output parts of the checkpoint (models/llama.py's HiggsAudioDecoder reads the decoder)
    skip_prefixes = ("embed_tokens.", "layers.", "norm.", "audio_decoder_proj.", "audio_codebook_embeddings.",
                     "audio_out_embed_projector.")

    def __init__(self, config: HiggsAudioEncoderConfig):
        super().__init__()
        self.config = config
        self.audio_tower = AudioTower(config)
        self.audio_encoder_proj = Projector(config)
        self.register_buffer("mel_filters", torch.from_numpy(mel_filters(16000, 400, config.num_mel_bins, 0.0, 8000.0)),
                             persistent=False)

    def forward(self, clips: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """-> (embeddings [T, text_hidden] of every clip one after another, each clip's count T_i)."""
        c, tower = self.config, self.audio_tower
        dtype = tower.conv1.weight.dtype
        mel = whisper_log_mel(clips, self.mel_filters, padded=True, extra=MEL_EXTRA)     # [mels, sum(m + extra)]
        valid = [mel_frames(x.numel()) for x in clips]
        if max(valid) > c.max_mel_frames:
            raise ValueError(f"a clip of {max(valid)} mel frames is longer than the tower's {c.max_mel_frames} (30 s)")
        widths = [m + MEL_EXTRA for m in valid]
        # slot i: a zero column at an odd offset, the clip's frames, zeros to an even length
        slots = [1 + w + (1 + w) % 2 for w in widths]
        starts = [1 + sum(slots[:i]) for i in range(len(slots))]
        buffer = mel.new_zeros((c.num_mel_bins, 1 + sum(slots)))
        where = torch.cat([torch.arange(w) + s + 1 for s, w in zip(starts, widths)]).to(mel.device)
        buffer[:, where] = mel
        x = F.gelu(tower.conv1(buffer[None].to(dtype)))[0]
        keep = torch.zeros(buffer.shape[1], dtype=dtype, device=x.device)
        keep[where] = 1                                       # conv2 pads each clip with zeros, as alone
        x = F.gelu(tower.conv2((x * keep)[None]))[0]          # [d, (1 + sum slots) // 2]: clip i from (s_i + 1) / 2
        lengths = [conv_frames(m) for m in valid]
        rows = torch.cat([torch.arange(n) + (s + 1) // 2 for s, n in zip(starts, lengths)]).to(x.device)
        x = x.T.index_select(0, rows) + tower.embed_positions.weight[torch.cat([torch.arange(n) for n in lengths]).to(x.device)]
        cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(x.device)
        for layer in tower.layers:
            x = layer(x, cu, lengths, max(lengths))
        counts = [(n - 2) // 2 + 1 for n in lengths]
        pairs = torch.cat([torch.arange(2 * k) + int(a) for k, a in zip(counts, cu[:-1].tolist())]).to(x.device)
        pooled = x.index_select(0, pairs).view(-1, 2, x.shape[1]).mean(1)
        return self.audio_encoder_proj.linear(tower.layer_norm(pooled)), counts

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "HiggsAudioEncoder":
        config = HiggsAudioEncoderConfig.from_folder(folder)
        with torch.device("meta"):
            model = cls(config)
        model = model.to_empty(device="cpu")
        model.mel_filters.copy_(torch.from_numpy(mel_filters(16000, 400, config.num_mel_bins, 0.0, 8000.0)))
        load_weights(model, folder)
        model = model.to(device=device)
        for p in model.parameters():
            p.data = p.data.to(dtype)
        return model.eval()

