"""Voice cloning for the Qwen3-TTS Base checkpoints: a reference clip (24 kHz mono) -> what conditions
the talker (Qwen3TTS.build_prompt):

  x-vector        `SpeakerEncoder` (ECAPA-TDNN, the release's `speaker_encoder.*`) over the log-mel
                  spectrogram the reference computes (`mel_spectrogram`, librosa's Slaney filters
                  rebuilt in numpy): one vector of the talker's width, put where a preset speaker's
                  codec embedding would go. Always used.
  reference codes `SpeechEncoder`: the 12 Hz speech tokenizer's encoder (`speech_tokenizer/` `encoder.*`),
                  a Mimi encoder + split RVQ, run as transformers' `MimiModel` without its decoder
                  (the release file uses the transformers 4.x names; `SpeechEncoder.rename` maps them).
                  audio -> [frames, 16] codes at 12.5 Hz. Used with the reference's transcript ("ICL"
                  mode): the talker then continues the reference's speech.

Both run on the CPU in the served pre step: they are small next to the talker, they run once per
request, and a bad clip then fails in the step that validates the request.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from triton_omni.media.audio_signal import mel_filters     # librosa's Slaney mel filters

SAMPLE_RATE = 24000          # both encoders' input rate (the release asserts it)
MEL = dict(n_fft=1024, num_mels=128, hop=256, win=1024, fmin=0.0, fmax=12000.0)   # extract_speaker_embedding's


# --- mel front end -------------------------------------------------------------------------------
def mel_spectrogram(wave: torch.Tensor) -> torch.Tensor:
    """The reference's speaker-encoder input: wave [B, S] (24 kHz) -> log-mel [B, frames, 128].
    Reflect-padded by (n_fft - hop) / 2 each side, uncentred Hann STFT, magnitude, mel, log(max(x, 1e-5))."""
    m = MEL
    basis = torch.from_numpy(mel_filters(SAMPLE_RATE, m["n_fft"], m["num_mels"], m["fmin"], m["fmax"])).to(wave.device)
    pad = (m["n_fft"] - m["hop"]) // 2
    y = F.pad(wave[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(y, m["n_fft"], hop_length=m["hop"], win_length=m["win"],
                      window=torch.hann_window(m["win"], device=wave.device), center=False, normalized=False,
                      onesided=True, return_complex=True)
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis @ spec, min=1e-5)).transpose(1, 2)


# --- speaker encoder (ECAPA-TDNN), the release's module names -------------------------------------
def _conv(c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int = 1, dilation: int = 1):
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """Channels in `scale` groups: group 0 passes, group i > 0 goes through a TDNN after adding group i-1's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(channels // scale, channels // scale, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = []
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            out.append(part if i == 0 else self.blocks[i - 1](part if i == 1 else part + out[-1]))
        return torch.cat(out, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1, self.conv2 = _conv(channels, se_channels), _conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))


class SERes2NetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(c_in, c_out)
        self.res2net_block = Res2Net(c_out, scale, kernel, dilation)
        self.tdnn2 = TDNN(c_out, c_out)
        self.se_block = SqueezeExcitation(c_out, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and std over time (weights sum to 1), computed as the reference does."""
    mean = (w * x).sum(2)
    return mean, torch.sqrt((w * (x - mean[..., None]).pow(2)).sum(2).clamp(1e-12))


class AttentiveStatsPool(nn.Module):
    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        mean, std = _stats(x, torch.full_like(x[:, :1], 1.0 / t))      # global context (uniform weights)
        ctx = torch.cat([x, mean[..., None].expand(-1, -1, t), std[..., None].expand(-1, -1, t)], dim=1)
        mean, std = _stats(x, F.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2))
        return torch.cat([mean, std], dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    """`speaker_encoder`: log-mel [B, frames, mel_dim] -> x-vector [B, enc_dim] (enc_dim = the talker's width)."""

    DEFAULTS = dict(mel_dim=128, enc_dim=1024, enc_channels=[512, 512, 512, 512, 1536], enc_kernel_sizes=[5, 3, 3, 3, 1],
                    enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=128, enc_res2net_scale=8, enc_se_channels=128)

    def __init__(self, config: dict):
        super().__init__()
        c = {**self.DEFAULTS, **config}
        ch, ks, ds = c["enc_channels"], c["enc_kernel_sizes"], c["enc_dilations"]
        self.blocks = nn.ModuleList([TDNN(c["mel_dim"], ch[0], ks[0], ds[0])])
        self.blocks.extend(SERes2NetBlock(ch[i - 1], ch[i], c["enc_res2net_scale"], c["enc_se_channels"], ks[i], ds[i])
                           for i in range(1, len(ch) - 1))
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], ds[-1])
        self.asp = AttentiveStatsPool(ch[-1], c["enc_attention_channels"])
        self.fc = _conv(ch[-1] * 2, c["enc_dim"])

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x, outs = mels.transpose(1, 2), []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))              # multi-layer feature aggregation
        return self.fc(self.asp(x))[..., 0]


# --- speech tokenizer encoder -------------------------------------------------------------------------
class SpeechEncoder(nn.Module):
    """The 12 Hz speech tokenizer's encoder: 24 kHz audio -> codes [frames, num_quantizers] (12.5 Hz,
    ceil(samples / 1920) frames), the first `encoder_valid_num_quantizers` (16) of Mimi's RVQ."""

    # the release file's transformers 4.x Mimi names -> transformers 5.x MimiModel's
    rename = (("encoder_transformer.", "encoder.encoder_transformer."), ("downsample.", "encoder.downsample."),
              ("encoder.", "encoder.encoder_seanet."))

    def __init__(self, config: dict):
        super().__init__()
        from transformers import MimiConfig, MimiModel

        # the reference's encoder (transformers 4.57 Mimi, eager / sdpa attention) ignores the config's
        # sliding window (only its flash-attention path applies it): a window as long as the positions
        # here, i.e. whole-clip causal attention
        fields = {k: v for k, v in config["encoder_config"].items() if k != "model_type"}
        mimi = MimiConfig(**{**fields, "sliding_window": fields.get("max_position_embeddings", 8000)})
        mimi.decoder_config = None                            # encoder and quantizer only
        self.mimi = MimiModel(mimi)
        self.num_quantizers = config.get("encoder_valid_num_quantizers", 16)
        self.frame_samples = config.get("encode_downsample_rate", 1920)

    def load(self, state: dict[str, torch.Tensor]) -> None:
        out = {}
        for name, t in state.items():
            for old, new in self.rename:
                if name.startswith(old):
                    name = new + name[len(old):]
                    break
            out[name] = t
        self.mimi.load_state_dict(out, strict=True)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        """wave [S] -> codes [frames, num_quantizers] (int64)."""
        codes = self.mimi.encode(wave.reshape(1, 1, -1), num_quantizers=self.num_quantizers).audio_codes[0]
        return codes[:, :-(-wave.shape[-1] // self.frame_samples)].T


# --- loading --------------------------------------------------------------------------------------
def _tensors(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix` (stripped) of one safetensors file or a folder of them, read alone."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    out = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key.startswith(prefix):
                    out[key[len(prefix):]] = f.get_tensor(key)
    if not out:
        raise KeyError(f"{path}: no tensors under {prefix!r} (not a Base checkpoint?)")
    return out


class VoiceCloner:
    """Both encoders of a Base release folder, float32 on `device`; clips at `rate`."""

    rate = SAMPLE_RATE

    def __init__(self, folder: str | Path, device: str | torch.device = "cpu"):
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        if config.get("tts_model_type") != "base":
            raise ValueError(f"{folder}: tts_model_type {config.get('tts_model_type')!r}; voice cloning needs a "
                             "Base checkpoint")
        with torch.device(device):
            self.speaker = SpeakerEncoder(config.get("speaker_encoder_config") or {})
            self.speaker.load_state_dict(_tensors(folder, "speaker_encoder."), strict=True)
            codec = folder / "speech_tokenizer"
            self.speech = SpeechEncoder(json.loads((codec / "config.json").read_text()))
            self.speech.load(_tensors(codec, "encoder."))
        self.speaker.eval()
        self.speech.eval()
        self.device = device

    @torch.inference_mode()
    def x_vector(self, wave: np.ndarray | torch.Tensor) -> torch.Tensor:
        """24 kHz mono [S] -> [enc_dim]."""
        wave = torch.as_tensor(wave, dtype=torch.float32, device=self.device).reshape(1, -1)
        return self.speaker(mel_spectrogram(wave))[0]

    @torch.inference_mode()
    def codes(self, wave: np.ndarray | torch.Tensor) -> torch.Tensor:
        """24 kHz mono [S] -> [frames, 16]."""
        return self.speech(torch.as_tensor(wave, dtype=torch.float32, device=self.device))
