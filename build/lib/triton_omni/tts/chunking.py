"""When streamed audio is cut, and which codec frames each cut decodes.

A talker emits codec frames one after another; the codec turns them into audio chunk by chunk.
Chunk boundaries are fixed in frames: a small first chunk (low latency), then equal larger ones.
A chunk [s, e) is decoded as the window [s - left, e + right) and only its own samples are kept:
`left`/`right` cover the decoder's receptive field, so every kept sample equals the same sample of
a whole-utterance decode and chunk boundaries cannot click. A chunk is therefore ready once frame
e + right exists; at the end of the utterance the rest is one last chunk.

Everything is a pure function of frame counts, so the streamed path (many small steps) and the
non-streamed path (one step with every frame) cut the same chunks and decode the same windows:
concatenated streamed audio equals the non-streamed audio.

Models that make a request's audio whole (Kokoro, OmniVoice) stream it through `speech_chunks`,
which cuts the finished waveform: a small first chunk, then equal larger ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, ResponseSink, Step, StepContext, register, string_array
from triton_omni.tts.checks import MAX_AUDIO_SECONDS, int_scalar, max_samples, waveform
from triton_omni.tts.request import AUDIO_CHUNK_OUTPUTS, SPEECH, Speech


@dataclass(frozen=True)
class ChunkPlan:
    first: int          # frames in the first chunk
    size: int           # frames in every later chunk
    left: int           # context frames decoded before a chunk
    right: int          # lookahead frames decoded after a chunk

    def __post_init__(self) -> None:
        if self.first < 1 or self.size < 1 or self.left < 0 or self.right < 0:
            raise ValueError(f"invalid chunk plan {self}")

    def ready_end(self, frames: int) -> int:
        """Where the audio that can be emitted with `frames` frames known ends (a boundary)."""
        if frames < self.first + self.right:
            return 0
        return self.first + (frames - self.right - self.first) // self.size * self.size

    def next_boundary(self, b: int) -> int:
        return self.first if b < self.first else b + self.size

    def chunks(self, before: int, now: int, final: bool) -> list[tuple[int, int]]:
        """The chunks [start, end) to emit when the frames known grow from `before` to `now`
        (`final`: the utterance ends at `now`)."""
        b, end = self.ready_end(before), self.ready_end(now)
        out = []
        while b < end:
            out.append((b, self.next_boundary(b)))
            b = out[-1][1]
        if final and b < now:
            out.append((b, now))
        return out

    def window(self, chunk: tuple[int, int], now: int) -> tuple[int, int]:
        """The frames decoded for a chunk: its receptive field, clipped to the utterance (a ready
        chunk's lookahead always exists; the last chunk ends at the last frame)."""
        start, end = chunk
        return max(0, start - self.left), min(end + self.right, now)

    def context_start(self, before: int) -> int:
        """The first frame the next emission can need, given `before` frames were known."""
        return max(0, self.ready_end(before) - self.left)


@dataclass
class Window:
    """One chunk's decode window, cut from a talker response."""
    request: int                    # index in the batch
    order: int                      # chunk order within the request
    data: np.ndarray                # the window's codec input (its length groups windows for a batch)
    start: int                      # first frame of the window
    keep: tuple[int, int]           # the chunk's frames, relative to the window
    seed: int = 0                   # for codecs that draw noise


def bit_stable_on_cpu(device, pad_rows: str) -> None:
    """pad_rows "fixed" promises a chunk the same bits whichever requests share its decoder call. On
    the CPU that also takes one intra-op thread in the codec's process: the decoders' rounding changes
    with the number of threads that split an op (tiny SNAC and Qwen3-TTS decoders: up to 6e-7 and 2e-6
    between 1 and 2 threads), and with torch's default threads a Qwen3-TTS stream decoded beside others
    differed from the same stream alone by 1 LSB in a few samples (tests/test_tts_qwen3_server.py,
    every run of one afternoon; with one thread, none). Why the threads split the two cases
    differently is not known."""
    if pad_rows == "fixed" and torch.device(device).type == "cpu":
        torch.set_num_threads(1)


class ChunkedCodec(Step):
    """Base of the stateless codec steps. Each talker response carries every frame its chunks'
    windows need; `windows` cuts them, and windows of the same length from all requests in the batch
    are decoded together, `decode_batch` rows per call at most. `pad_rows` "fixed" pads every call to
    `decode_batch` rows (with copies of a row): a convolution's rounding can depend on the batch size,
    and so a window decodes to the same bits whichever requests share its batch (streamed audio ==
    non-streamed audio bit for bit). "pow2" pads only to the next power of two: a lone stream then
    decodes 1 row instead of 16 (on an H200 the 16-row padding made the codec, not the talker, the
    bottleneck of a Qwen3-TTS server), and a window's samples may differ in their last bits (~1e-3
    on a GPU with TF32 convolutions) with the number of requests sharing the call.
    A subclass sets `sample_rate`, `frame_samples` and `plan`, and implements `windows` (most through
    `plan_windows`) and `decode_rows`."""
    outputs = AUDIO_CHUNK_OUTPUTS
    sample_rate: int
    frame_samples: int

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        if self.params.decode_batch < 1:
            raise ValueError("decode_batch must be >= 1")
        if self.params.pad_rows not in ("fixed", "pow2"):
            raise ValueError(f"pad_rows must be 'fixed' or 'pow2', got {self.params.pad_rows!r}")
        bit_stable_on_cpu(ctx.device, self.params.pad_rows)
        self.dtype = torch_dtype(self.params.dtype)

    def windows(self, index: int, req: Request) -> list[Window]:
        """The windows one talker response asks for."""
        raise NotImplementedError

    def plan_windows(self, index: int, req: Request, data: np.ndarray, per_frame: int, most: int,
                     seed: int = 0) -> list[Window]:
        """The windows of a talker response whose `data` (tokens or frames, `per_frame` a frame) are the
        stream's last entries: `num_context` of them sent before, `completion_tokens` (at most `most`) in
        all so far. The counts are checked against `data`: any client may call the codec."""
        n_ctx = int_scalar(req, "num_context", 0, len(data))
        total = int_scalar(req, "completion_tokens", len(data), most)
        if (req.string("finish_reason") or "") == "cancelled":     # nobody is listening
            return []
        before, first = total - (len(data) - n_ctx), total - len(data)     # first: stream index of data[0]
        final = bool(req.string("finish_reason"))
        out = []
        for order, chunk in enumerate(self.plan.chunks(before // per_frame, total // per_frame, final)):
            start, end = self.plan.window(chunk, total // per_frame)
            if start * per_frame < first:
                raise InvalidInput("num_context", f"the response starts at entry {first}, the decode window of "
                                                  f"its chunk at {start * per_frame}: too little left context "
                                                  "(talker and codec disagree on the chunk plan?)")
            out.append(Window(index, order, data[start * per_frame - first:end * per_frame - first], start,
                              (chunk[0] - start, chunk[1] - start), seed))
        return out

    def decode_rows(self, rows: list[Window]):
        """`decode_batch` same-length windows -> their waveforms, [rows, samples] (numpy, float32)."""
        raise NotImplementedError

    def decode(self, group: list[Window]) -> list[np.ndarray]:
        """Same-length windows -> each one's kept samples, `decode_batch` rows per call at most."""
        n, fs = self.params.decode_batch, self.frame_samples
        out = []
        for i in range(0, len(group), n):
            rows = group[i:i + n]
            size = n if self.params.pad_rows == "fixed" else min(n, 1 << (len(rows) - 1).bit_length())
            wave = self.decode_rows(rows + [rows[0]] * (size - len(rows)))
            out += [wave[r, w.keep[0] * fs:w.keep[1] * fs] for r, w in enumerate(rows)]
        return out

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        jobs: list[Window] = []
        for i, req in enumerate(requests):
            try:
                jobs += self.windows(i, req)
            except Exception as exc:  # noqa: BLE001 - this request fails, its neighbours go on
                results[i] = exc
        pieces: dict[tuple[int, int], np.ndarray] = {}
        for length in sorted({len(w.data) for w in jobs}):
            group = [w for w in jobs if len(w.data) == length]
            for w, samples in zip(group, self.decode(group)):
                pieces[(w.request, w.order)] = samples
        for i, req in enumerate(requests):
            if results[i] is not None:
                continue
            mine = [pieces[k] for k in sorted(k for k in pieces if k[0] == i)]
            results[i] = {"waveform": np.concatenate(mine) if mine else np.zeros(0, np.float32),
                          "sample_rate": np.asarray([self.sample_rate], dtype=np.int32),
                          "finish_reason": req.get("finish_reason"),
                          "speech": req.get("speech")}
        return results


@dataclass
class SpeechChunksParams:
    first_chunk_ms: int = 200           # small, so that a player starts at once
    chunk_ms: int = 1000
    max_seconds: float = MAX_AUDIO_SECONDS     # the longest waveform taken (at its sample rate)


@register("speech_chunks")
class SpeechChunks(Step):
    """A whole waveform -> one response (not streaming) or chunks of it, the last one final with
    finish_reason `stop`: for models that make a request's audio at once."""
    decoupled = True
    inputs = (
        TensorSpec("waveform", "TYPE_FP32", (-1,)),
        TensorSpec("sample_rate", "TYPE_INT32", (1,)),
        SPEECH,
    )
    outputs = AUDIO_CHUNK_OUTPUTS
    Params = SpeechChunksParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        if self.params.first_chunk_ms < 1 or self.params.chunk_ms < 1:
            raise ValueError("first_chunk_ms and chunk_ms must be >= 1")

    def input_limits(self) -> dict:
        return {"waveform": (max_samples(self.params.max_seconds),)}

    def cuts(self, samples: int, rate: int) -> list[int]:
        """Chunk ends: the first after first_chunk_ms, then every chunk_ms, the last at the end."""
        first, size = rate * self.params.first_chunk_ms // 1000, rate * self.params.chunk_ms // 1000
        return list(range(max(first, 1), samples, max(size, 1))) + [samples]

    def submit(self, request: Request, sink: ResponseSink) -> None:
        """All of it at once: the audio is there already (no cancellation to watch for)."""
        wave, rate = waveform(request, self.params.max_seconds)
        speech = request.get("speech")
        ends = self.cuts(len(wave), rate) if Speech.from_request(request).stream else [len(wave)]
        start = 0
        for n, end in enumerate(ends):
            last = n == len(ends) - 1
            sink.send({"waveform": np.ascontiguousarray(wave[start:end], dtype=np.float32),
                       "sample_rate": np.asarray([rate], dtype=np.int32),
                       "finish_reason": string_array("stop" if last else ""),
                       "speech": speech}, final=last)
            start = end
