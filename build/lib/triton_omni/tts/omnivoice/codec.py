"""OmniVoice's codec (the HiggsAudioV2 tokenizer) and the waveforms around it (model.py has the model).

The codec is written against transformers' DAC and HuBERT parts (HiggsAudioV2TokenizerModel itself
imports torchaudio, which serving does not need), in two halves:
- decoding: RVQ codebook lookup + project_out per codebook, fc2, DAC decoder with the model's output
  padding and without tanh;
- encoding (voice cloning, CodecEncoder): a reference clip -> its 8 codebooks of codes, which follow
  the text in the prompt. The clip is prepared as the release prepares it (prepare_reference: loudness,
  silence trimming, whole frames), resampled with torchaudio's sinc kernel (media.audio_signal.resample).
  With a reference the duration estimate scales by the reference's text and frame count, and the new
  speech gets the reference's loudness (a quiet reference's RMS) instead of a 0.5 peak.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.media.audio_signal import resample

# -- the codec (HiggsAudioV2 tokenizer) ----------------------------------------------------------------

@dataclass
class CodecSizes:
    hidden: int
    acoustic_hidden: int
    semantic_hidden: int
    hop: int
    frame_rate: int
    num_quantizers: int


def codec_sizes(config: dict) -> CodecSizes:
    """HiggsAudioV2TokenizerConfig's derived sizes."""
    acoustic, semantic = config["acoustic_model_config"], config["semantic_model_config"]
    hop = int(np.prod(acoustic["downsampling_ratios"]))
    frame_rate = math.ceil(config["sample_rate"] / hop)
    bits = math.ceil(math.log2(config["codebook_size"]))
    return CodecSizes(hidden=acoustic["hidden_size"] + semantic["hidden_size"], acoustic_hidden=acoustic["hidden_size"],
                      semantic_hidden=semantic["hidden_size"], hop=hop, frame_rate=frame_rate,
                      num_quantizers=int(1000 * config["target_bandwidths"][-1] // (frame_rate * bits)))


class _Unit(nn.Module):
    """The semantic stacks' residual unit (HiggsAudioV2TokenizerResidualUnit)."""

    def __init__(self, config: dict, channels: int, dilation: int):
        super().__init__()
        k = config["unit_kernel_size"]
        self.activation = nn.ELU()
        self.conv1 = nn.Conv1d(channels, channels, k, padding=((k - 1) // 2) * dilation, dilation=dilation, bias=False)
        self.conv2 = nn.Conv1d(channels, channels, 1, bias=False)

    def forward(self, x):
        return x + self.conv2(self.activation(self.conv1(self.activation(x))))


class _EncoderBlock(nn.Module):
    def __init__(self, config: dict, cin: int, cout: int, stride: int):
        super().__init__()
        self.res_units = nn.ModuleList([_Unit(config, cin, d) for d in config["block_dilations"]])
        kernel = 3 if stride == 1 else 2 * stride
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, padding=(kernel - 1) // 2)

    def forward(self, x):
        for unit in self.res_units:
            x = unit(x)
        return self.conv(x)


class SemanticEncoder(nn.Module):
    """The codec's semantic encoder (its parameter names): HuBERT features -> the semantic half of a frame."""

    def __init__(self, config: dict):
        super().__init__()
        h, k = config["semantic_model_config"]["hidden_size"], config["kernel_size"]
        self.conv = nn.Conv1d(h, h, k, 1, k // 2, bias=False)
        chans = [h] + [int(h * r) for r in config["channel_ratios"]]
        self.conv_blocks = nn.ModuleList([_EncoderBlock(config, chans[i], chans[i + 1], s)
                                          for i, s in enumerate(config["strides"])])

    def forward(self, x):
        x = self.conv(x)
        for block in self.conv_blocks:
            x = block(x)
        return x


class SemanticDecoder(nn.Module):
    """The codec's semantic decoder (training only; here for its parameter names). Stride-1 blocks, as
    the release config has."""

    def __init__(self, config: dict):
        super().__init__()
        h, k = config["semantic_model_config"]["hidden_size"], config["kernel_size"]
        if any(s != 1 for s in config["strides"]):
            raise ValueError("only stride-1 semantic blocks are supported")
        ratios = config["channel_ratios"]
        chans = [int(h * r) for r in ratios] + [h]
        self.conv1 = nn.Conv1d(h, chans[0], k, 1, k // 2, bias=False)
        self.conv_blocks = nn.ModuleList()
        for i in range(len(ratios)):
            block = nn.Module()
            block.conv = nn.Conv1d(chans[i], chans[i + 1], 3, 1, 1)
            block.res_units = nn.ModuleList([_Unit(config, chans[i + 1], d) for d in config["block_dilations"]])
            self.conv_blocks.append(block)
        self.conv2 = nn.Conv1d(h, h, k, 1, k // 2, bias=False)


class Codec(nn.Module):
    """The decoding half of HiggsAudioV2TokenizerModel, under its parameter names."""

    def __init__(self, config: dict):
        super().__init__()
        from transformers import DacConfig
        from transformers.models.dac.modeling_dac import DacDecoder

        self.sizes = codec_sizes(config)
        self.sample_rate = config["sample_rate"]
        self.acoustic_decoder = DacDecoder(DacConfig(**{k: v for k, v in config["acoustic_model_config"].items()
                                                        if k != "model_type"}))
        for m in self.acoustic_decoder.modules():       # HiggsAudioV2TokenizerModel._adjust_dac_decoder
            if isinstance(m, nn.ConvTranspose1d):
                m.output_padding = (m.stride[0] % 2,)
        self.acoustic_decoder.tanh = nn.Identity()
        self.quantizer = nn.Module()
        self.quantizer.quantizers = nn.ModuleList()
        for _ in range(self.sizes.num_quantizers):
            q = nn.Module()
            q.codebook = nn.Module()
            q.codebook.register_buffer("embed", torch.zeros(config["codebook_size"], config["codebook_dim"]))
            q.project_out = nn.Linear(config["codebook_dim"], self.sizes.hidden)
            self.quantizer.quantizers.append(q)
        self.fc2 = nn.Linear(self.sizes.hidden, self.sizes.acoustic_hidden)

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu") -> "Codec":
        return _load_codec_half(cls, folder, device)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, C, T] -> waveforms [B, T * hop] (HiggsAudioV2TokenizerModel.decode)."""
        quantized = torch.full((), 0.0, device=codes.device)
        for q, idx in zip(self.quantizer.quantizers, codes.transpose(0, 1)):
            quantized = quantized + q.project_out(F.embedding(idx, q.codebook.embed)).permute(0, 2, 1)
        acoustic = self.fc2(quantized.transpose(1, 2)).transpose(1, 2)
        return self.acoustic_decoder(acoustic)[:, 0]


def _load_codec_half(cls, folder: str | Path, device: str):
    """One half of the codec (its module under the model's names) with the weights of the folder's
    model.safetensors that it has; the other half's are not read."""
    from safetensors import safe_open

    folder = Path(folder)
    module = cls(json.loads((folder / "config.json").read_text()))
    ours = module.state_dict()
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys() if k in ours}
    # HuBERT's masked_spec_embed is for training-time masking; the release file may leave it out
    missing = sorted(k for k in set(ours) - set(state) if not k.endswith("masked_spec_embed"))
    if missing:
        raise ValueError(f"{folder}: codec weights missing: {missing[:5]}")
    module.load_state_dict(state, strict=False)
    return module.to(device).eval()


# -- voice cloning: a reference clip -> its codes (create_voice_clone_prompt) ----------------------------

class CodecEncoder(nn.Module):
    """The encoding half of HiggsAudioV2TokenizerModel, under its parameter names: 24 kHz audio ->
    codes [num_quantizers, frames] (HiggsAudioV2TokenizerModel.encode at its highest bandwidth).
    A frame joins the DAC encoder's acoustic features with semantic ones: HuBERT on the clip resampled
    to 16 kHz (padded 10 ms each side; the mean of all its hidden states, every k-th frame to reach
    25 Hz) through the semantic conv stack. `fc` mixes them, then residual VQ: each quantizer takes the
    codebook entry nearest to project_in(residual) and subtracts its project_out."""

    def __init__(self, config: dict):
        super().__init__()
        from transformers import DacConfig, HubertConfig, HubertModel
        from transformers.models.dac.modeling_dac import DacEncoder

        self.sizes = codec_sizes(config)
        self.sample_rate, self.semantic_rate = config["sample_rate"], config["semantic_sample_rate"]
        self.semantic_step = int(self.sizes.hop / (self.sample_rate / self.semantic_rate) / config["downsample_factor"])
        sub = {k: v for k, v in config["acoustic_model_config"].items() if k != "model_type"}
        self.acoustic_encoder = DacEncoder(DacConfig(**sub))
        self.encoder_semantic = SemanticEncoder(config)
        sub = {k: v for k, v in config["semantic_model_config"].items() if k != "model_type"}
        self.semantic_model = HubertModel(HubertConfig(**sub))
        self.fc = nn.Linear(self.sizes.hidden, self.sizes.hidden)
        self.quantizer = nn.Module()
        self.quantizer.quantizers = nn.ModuleList()
        for _ in range(self.sizes.num_quantizers):
            q = nn.Module()
            q.codebook = nn.Module()
            q.codebook.register_buffer("embed", torch.zeros(config["codebook_size"], config["codebook_dim"]))
            q.project_in = nn.Linear(self.sizes.hidden, config["codebook_dim"])
            q.project_out = nn.Linear(config["codebook_dim"], self.sizes.hidden)
            self.quantizer.quantizers.append(q)

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu") -> "CodecEncoder":
        return _load_codec_half(cls, folder, device)

    def acoustic_frames(self, samples: int) -> int:
        """The DAC encoder's output length, conv by conv (the model's _get_conv1d_output_lengths)."""
        for m in self.acoustic_encoder.modules():
            if isinstance(m, nn.Conv1d):
                samples = int((samples + 2 * m.padding[0] - m.dilation[0] * (m.kernel_size[0] - 1) - 1) / m.stride[0]
                              + 1)
        return samples

    @torch.inference_mode()
    def encode(self, wave: torch.Tensor) -> torch.Tensor:
        """wave [S] at 24 kHz -> codes [num_quantizers, frames] (long)."""
        x = wave.reshape(1, 1, -1).to(self.fc.weight)
        semantic_in = F.pad(resample(x, self.sample_rate, self.semantic_rate)[:, 0], (160, 160))
        hidden = self.semantic_model(semantic_in, output_hidden_states=True).hidden_states
        semantic = torch.stack(hidden, dim=1).mean(dim=1)[:, ::self.semantic_step]
        semantic = self.encoder_semantic(semantic.transpose(1, 2))
        if self.acoustic_frames(x.shape[-1]) != semantic.shape[-1]:     # the model pads only then
            x = F.pad(x, (self.sizes.hop // 2, self.sizes.hop // 2))
        joined = torch.cat([self.acoustic_encoder(x), semantic], dim=1)
        residual = self.fc(joined.transpose(1, 2)).transpose(1, 2)       # [1, H, T]
        codes = []
        for q in self.quantizer.quantizers:
            h = q.project_in(residual.permute(0, 2, 1)).reshape(-1, q.codebook.embed.shape[1])
            embed = q.codebook.embed.t()
            # nearest entry by squared distance, written as the model writes it (same rounding, same ties)
            dist = -(h.pow(2).sum(1, keepdim=True) - 2 * h @ embed + embed.pow(2).sum(0, keepdim=True))
            idx = dist.max(dim=-1).indices.view(1, -1)
            residual = residual - q.project_out(F.embedding(idx, q.codebook.embed)).permute(0, 2, 1)
            codes.append(idx[0])
        return torch.stack(codes)


def prepare_reference(wave: np.ndarray, rate: int, hop: int) -> tuple[np.ndarray, float]:
    """A clip as the release encodes it when given its transcript (create_voice_clone_prompt,
    preprocess_prompt on): its RMS (which later sets the new speech's loudness), a quiet clip raised to
    RMS 0.1, silences over 200 ms shortened to 200 ms, the edges to 100 ms (lead) and 200 ms (trail),
    then cut to whole frames of `hop` samples. Returns (wave, rms); the wave may come back empty."""
    wave = np.asarray(wave, dtype=np.float32)[None]     # [1, S] float32, the release's arithmetic
    rms = float(np.sqrt(np.mean(wave ** 2)))
    if 0 < rms < 0.1:
        wave = wave * 0.1 / rms
    wave = remove_silence(wave[0], rate, mid_ms=200, lead_ms=100, trail_ms=200)
    return wave[:len(wave) - len(wave) % hop], rms


def remove_silence(wave: np.ndarray, rate: int, mid_ms: int = 500, lead_ms: int = 100, trail_ms: int = 100,
                   thresh_db: float = -50.0) -> np.ndarray:
    """omnivoice.utils.audio.remove_silence, which runs pydub on 16-bit samples: silences longer than
    mid_ms (windows of mid_ms every 10 ms with an integer RMS at most thresh_db) shrink to mid_ms, then
    the leading and trailing silence (10 ms chunks under thresh_db) to lead_ms / trail_ms. pydub's
    millisecond arithmetic and integer RMS are kept, so the samples kept are the release's."""
    pcm = (np.asarray(wave, dtype=np.float32) * 32768.0).clip(-32768, 32767).astype(np.int16)
    per_ms, limit = rate / 1000.0, 10 ** (thresh_db / 20) * 32768

    def length(x) -> int:
        return round(1000 * (len(x) / rate))

    def cut(x, a, b):                                   # AudioSegment[a:b]: ms, zero-filled past the end
        n = length(x)
        a, b = int(min(a, n) * per_ms), int(min(b, n) * per_ms)
        piece = x[a:b]
        return np.concatenate([piece, np.zeros(b - a - len(piece), np.int16)]) if len(piece) < b - a else piece

    def rms(x) -> int:                                  # audioop.rms
        return int(math.sqrt(np.square(x, dtype=np.float64).sum() / len(x))) if len(x) else 0

    def quiet(x) -> bool:                               # dBFS < thresh_db
        r = rms(x)
        return not r or 20 * math.log(r / 32768, 10) < thresh_db

    def leading(x) -> int:                              # detect_leading_silence
        t = 0
        while quiet(cut(x, t, t + 10)) and t < length(x):
            t += 10
        return min(t, length(x))

    n = length(pcm)
    silent: list[list[int]] = []                        # detect_silence(min_silence_len=mid_ms, seek_step=10)
    if n >= mid_ms:
        last = n - mid_ms
        for i in [*range(0, last + 1, 10), *([last] if last % 10 else [])]:
            if rms(cut(pcm, i, i + mid_ms)) <= limit:
                if silent and (i == silent[-1][1] - mid_ms + 10 or i <= silent[-1][1]):
                    silent[-1][1] = i + mid_ms          # continues the silence
                else:
                    silent.append([i, i + mid_ms])
    if not silent:                                      # detect_nonsilent
        loud = [[0, n]]
    elif silent[0] == [0, n]:
        loud = []
    else:
        loud, prev = [], 0
        for a, b in silent:
            loud.append([prev, a])
            prev = b
        if prev != n:
            loud.append([prev, n])
        if loud[0] == [0, 0]:
            loud.pop(0)
    ranges = [[a - mid_ms, b + mid_ms] for a, b in loud]     # split_on_silence(keep_silence=mid_ms)
    for r1, r2 in zip(ranges, ranges[1:]):              # overlapping neighbours meet halfway
        if r2[0] < r1[1]:
            r1[1] = r2[0] = (r1[1] + r2[0]) // 2
    pieces = [cut(pcm, max(a, 0), min(b, n)) for a, b in ranges]
    pcm = np.concatenate(pieces) if pieces else np.zeros(0, np.int16)
    pcm = cut(pcm, max(0, leading(pcm) - lead_ms), length(pcm))[::-1]
    pcm = cut(pcm, max(0, leading(pcm) - trail_ms), length(pcm))[::-1]
    return pcm.astype(np.float32) / 32768.0


def finish(wave: np.ndarray, rate: int, ref_rms: float | None = None, trim_silence: bool = True,
           pad_s: float = 0.1, fade_s: float = 0.1) -> np.ndarray:
    """The release's post-processing (_post_process_audio, fade_and_pad_audio): long silences removed
    (`trim_silence`, postprocess_output), peak 0.5 without a reference voice, a quiet reference's loudness
    with one; a fade in and out, then silence padding on both sides. float32 numpy, as the release."""
    if trim_silence:
        wave = remove_silence(wave, rate)
    wave = np.asarray(wave, dtype=np.float32)[None]
    if ref_rms is not None and ref_rms < 0.1:
        wave = wave * ref_rms / 0.1
    elif ref_rms is None:
        peak = np.abs(wave).max() if wave.size else 0.0
        if peak > 1e-6:
            wave = wave / peak * 0.5
    if wave.shape[-1] == 0:
        return wave[0]
    fade, pad = int(fade_s * rate), int(pad_s * rate)
    wave = wave.copy()
    k = min(fade, wave.shape[-1] // 2)
    if k > 0:
        wave[..., :k] *= np.linspace(0, 1, k, dtype=np.float32)[None]
        wave[..., -k:] *= np.linspace(1, 0, k, dtype=np.float32)[None]
    if pad > 0:
        silence = np.zeros((1, pad), dtype=wave.dtype)
        wave = np.concatenate([silence, wave, silence], axis=-1)
    return wave[0]
