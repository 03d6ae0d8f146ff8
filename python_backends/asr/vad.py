"""Voice activity detection with Silero VAD (the `silero-vad` package's 16 kHz model and weights).

The package runs its TorchScript model one 32 ms window per call (its LSTM carries state from window to
window): about a millisecond a call, so an hour of audio takes minutes of calls. Here the same network
is plain torch, with the weights of the package's default model (data/silero_vad.jit, read as a state
dict; the package's silero_vad_16k.safetensors holds other weights): the
convolutions run over every window of a clip at once and only the LSTM steps window by window, over
many parts of a long clip side by side. Each part starts `WARMUP_WINDOWS` early, from zero state,
so its state has settled by the first window it reports (tests/test_asr_vad.py checks the
probabilities against the package's model).

`speech_regions` turns probabilities into speech spans as the package's get_speech_timestamps does
(a threshold to start speech, a lower one to end it, minimum speech and silence durations, padding).
"""
from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

RATE = 16000
WINDOW = 512                # samples per probability (32 ms)
CONTEXT = 64                # samples of the previous window each window sees
PART_WINDOWS = 1875         # windows per part run side by side (60 s)
WARMUP_WINDOWS = 64         # windows a part runs before its first reported one (2 s)
FEATURE_WINDOWS = 8 * PART_WINDOWS     # windows whose convolutions run together (8 minutes)


def weights_file() -> Path:
    """The package's default model, found without importing the package (its import sets torch's thread
    count to 1 for the whole process)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("voice activity detection needs the 'silero-vad' package (pip install silero-vad)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.jit"


class SileroVAD(nn.Module):
    def __init__(self):
        super().__init__()
        self.stft_conv = nn.Conv1d(1, 258, 256, stride=128, bias=False)      # real and imaginary parts of 129 bins
        self.conv1 = nn.Conv1d(129, 128, 3, padding=1)
        self.conv2 = nn.Conv1d(128, 64, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.conv4 = nn.Conv1d(64, 128, 3, padding=1)
        self.lstm_cell = nn.LSTMCell(128, 128)
        self.final_conv = nn.Conv1d(128, 1, 1)

    @classmethod
    def load(cls, path: str | Path | None = None) -> "SileroVAD":
        archive = torch.jit.load(str(path or weights_file()), map_location="cpu")
        own = archive._model.state_dict()        # the 16 kHz network (the archive also holds an 8 kHz one)
        names = {"stft_conv.weight": "stft.forward_basis_buffer", "final_conv.": "decoder.decoder.2.",
                 "lstm_cell.": "decoder.rnn.", **{f"conv{i + 1}.": f"encoder.{i}.reparam_conv." for i in range(4)}}
        model = cls()
        state = {}
        for name in model.state_dict():
            prefix = next(p for p in names if name.startswith(p))
            state[name] = own[names[prefix] + name[len(prefix):]]
        model.load_state_dict(state)
        return model.eval()

    def features(self, windows: torch.Tensor) -> torch.Tensor:
        """windows [W, CONTEXT + WINDOW] -> the LSTM's inputs [W, 128] (each window on its own)."""
        x = F.pad(windows, (0, 64), mode="reflect")[:, None]
        x = self.stft_conv(x)
        x = (x[:, :129] ** 2 + x[:, 129:] ** 2).sqrt()
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            x = F.relu(conv(x))
        return x[:, :, 0]

    @torch.inference_mode()
    def probabilities(self, wave: torch.Tensor) -> torch.Tensor:
        """Speech probability of each 512-sample window of a 16 kHz clip [S] (the last one zero-padded)."""
        n = -(-wave.numel() // WINDOW)
        if n == 0:
            return wave.new_zeros(0)
        padded = F.pad(wave.float(), (CONTEXT, n * WINDOW - wave.numel()))
        windows = padded.unfold(0, CONTEXT + WINDOW, WINDOW)                 # [n, 576], a view
        # the convolutions a few minutes at a time: an hour's spectra at once would be half a gigabyte
        feats = torch.cat([self.features(windows[i:i + FEATURE_WINDOWS]) for i in range(0, n, FEATURE_WINDOWS)])
        # parts of PART_WINDOWS windows, each preceded by up to WARMUP_WINDOWS of the part before it
        starts = list(range(0, n, PART_WINDOWS))
        lead = [min(WARMUP_WINDOWS, s) for s in starts]
        steps = max(min(s + PART_WINDOWS, n) - s + w for s, w in zip(starts, lead))
        rows = torch.zeros(len(starts), steps, feats.shape[1])
        for i, (s, w) in enumerate(zip(starts, lead)):
            part = feats[s - w:min(s + PART_WINDOWS, n)]
            rows[i, :part.shape[0]] = part
        h = c = feats.new_zeros(len(starts), 128)
        hidden = []
        with one_thread():
            for t in range(steps):
                h, c = self.lstm_cell(rows[:, t], (h, c))
                hidden.append(h)
        out = torch.sigmoid(self.final_conv(F.relu(torch.stack(hidden, 2))))[:, 0]      # [parts, steps]
        return torch.cat([out[i, w:w + min(s + PART_WINDOWS, n) - s] for i, (s, w) in enumerate(zip(starts, lead))])


@contextlib.contextmanager
def one_thread():
    """Torch on one thread meanwhile: a step of the LSTM is microseconds of work, which a second thread
    only slows (on a busy 2-core machine a step took 100 ms on two threads, 0.25 ms on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class VADSettings:
    threshold: float = 0.5           # speech starts above this probability
    min_speech_ms: int = 250         # shorter bursts are dropped
    min_silence_ms: int = 100        # shorter pauses do not end speech
    pad_ms: int = 30                 # added on both sides of each region


def speech_regions(probs: torch.Tensor, samples: int, s: VADSettings = VADSettings()) -> list[tuple[int, int]]:
    """[(start, end)] sample spans of speech: speech begins at a window above `threshold` and ends after
    `min_silence_ms` below threshold - 0.15 (get_speech_timestamps' hysteresis); regions shorter than
    `min_speech_ms` are dropped; each is padded by `pad_ms`, without overlapping its neighbours."""
    low = max(s.threshold - 0.15, 0.01)
    min_silence, min_speech, pad = (ms * RATE // 1000 for ms in (s.min_silence_ms, s.min_speech_ms, s.pad_ms))
    regions, start, silent_since = [], None, None
    for i, p in enumerate(probs.tolist()):
        at = i * WINDOW
        if p >= s.threshold:
            silent_since = None
            if start is None:
                start = at
        elif start is not None and p < low:
            silent_since = at if silent_since is None else silent_since
            if at - silent_since >= min_silence:
                regions.append((start, silent_since))
                start, silent_since = None, None
    if start is not None:
        regions.append((start, samples))
    regions = [(a, b) for a, b in regions if b - a >= min_speech]
    padded = []
    for i, (a, b) in enumerate(regions):
        lo = max(0, a - pad) if not padded else max(padded[-1][1], a - pad)
        hi = min(samples, b + pad) if i + 1 == len(regions) else min(b + pad, (b + regions[i + 1][0]) // 2)
        padded.append((lo, hi))
    return padded
