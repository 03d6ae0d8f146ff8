"""Orpheus' codec step: audio tokens -> 24 kHz waveform chunks with SNAC, batched across requests.

Stateless: each talker response carries the tokens of every frame its chunks' windows need (see
talker.py), the running token count and whether the utterance ended. From those the step finds the
chunks to emit (`ChunkPlan`), decodes each chunk's window and keeps the chunk's own samples.

Windows of the same length from all requests in the batch are decoded together, always
`decode_batch` rows per call (short groups padded with a copy of a row): a convolution's rounding
can depend on the batch size, and a window must decode to the same bits whichever requests share
its batch, or streamed audio would differ from non-streamed audio in the last bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from python_backends.runtime.spec import TensorSpec
from python_backends.runtime.step import Request, Step, StepContext, register
from python_backends.text.tokenizer import load_tokenizer
from python_backends.tts.chunking import ChunkPlan
from python_backends.tts.orpheus import TOKENS_PER_FRAME as TPF, OrpheusTokens, frames_to_codes
from python_backends.tts.request import SPEECH, Speech
from python_backends.tts.snac import PositionalNoise, load_snac

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class OrpheusCodecParams:
    checkpoint: str = ""            # the talker's folder: its tokenizer places the audio tokens
    codec_checkpoint: str = ""      # the SNAC folder (config.json + pytorch_model.bin)
    dtype: str = "float32"
    first_chunk_frames: int = 2
    chunk_frames: int = 8
    decode_batch: int = 4           # windows per decoder call (fixed, see above)


@dataclass
class _Window:
    request: int                    # index in the batch
    order: int                      # chunk order within the request
    tokens: np.ndarray              # [frames * 7] of the window
    start: int                      # first frame of the window
    keep: tuple[int, int]           # the chunk's frames, relative to the window
    seed: int


@register("orpheus_codec")
class OrpheusCodec(Step):
    inputs = (
        TensorSpec("token_ids", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("num_context", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    outputs = (
        TensorSpec("waveform", "TYPE_FP32", (-1,)),
        TensorSpec("sample_rate", "TYPE_INT32", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = OrpheusCodecParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        if p.dtype not in DTYPES or p.decode_batch < 1:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)} and decode_batch >= 1")
        self.audio_start = OrpheusTokens.from_tokenizer(load_tokenizer(ctx.checkpoint(p.checkpoint))).audio_start
        self.snac = load_snac(ctx.checkpoint(p.codec_checkpoint), ctx.device, DTYPES[p.dtype])
        left, right = self.snac.context_frames()
        self.plan = ChunkPlan(p.first_chunk_frames, p.chunk_frames, left, right)

    def windows(self, index: int, req: Request) -> list[_Window]:
        """The windows one talker response asks for."""
        ids = req.get("token_ids")
        ids = ids.cpu().numpy() if hasattr(ids, "cpu") else ids     # a GPU step may be handed torch tensors
        n_ctx, total = int(req.scalar("num_context")), int(req.scalar("completion_tokens"))
        reason = req.string("finish_reason") or ""
        before = total - (ids.shape[0] - n_ctx)
        first = before - n_ctx                          # stream index of ids[0]
        if reason == "cancelled":                       # nobody is listening
            return []
        out = []
        for order, chunk in enumerate(self.plan.chunks(before // TPF, total // TPF, final=bool(reason))):
            start, end = self.plan.window(chunk, total // TPF)
            if start * TPF < first:
                raise RuntimeError(f"the talker sent context from token {first}, the window needs {start * TPF}: "
                                   "talker and codec disagree on the chunk plan or the codec")
            out.append(_Window(index, order, ids[start * TPF - first:end * TPF - first], start,
                               (chunk[0] - start, chunk[1] - start), Speech.from_request(req).seed))
        return out

    def decode(self, group: list[_Window]) -> list[np.ndarray]:
        """Same-length windows -> each one's kept samples, `decode_batch` rows per call."""
        n, fs = self.params.decode_batch, self.snac.frame_samples
        out = []
        for i in range(0, len(group), n):
            rows = group[i:i + n]
            rows = rows + [rows[0]] * (n - len(rows))
            codes = [c.to(self.ctx.device) for c in frames_to_codes(np.stack([w.tokens for w in rows]),
                                                                    self.audio_start, self.snac.codebook_size)]
            noise = PositionalNoise(torch.tensor([w.seed for w in rows]),
                                    torch.tensor([w.start * self.snac.frame_steps for w in rows]))
            wave = self.snac.decode(codes, noise)[:, 0].float().cpu().numpy()
            out += [wave[r, w.keep[0] * fs:w.keep[1] * fs] for r, w in enumerate(group[i:i + n])]
        return out

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        jobs: list[_Window] = []
        for i, req in enumerate(requests):
            try:
                jobs += self.windows(i, req)
            except Exception as exc:  # noqa: BLE001 - this request fails, its neighbours go on
                results[i] = exc
        pieces: dict[tuple[int, int], np.ndarray] = {}
        for length in sorted({len(w.tokens) for w in jobs}):
            group = [w for w in jobs if len(w.tokens) == length]
            for w, samples in zip(group, self.decode(group)):
                pieces[(w.request, w.order)] = samples
        for i, req in enumerate(requests):
            if results[i] is not None:
                continue
            mine = [pieces[k] for k in sorted(k for k in pieces if k[0] == i)]
            results[i] = {"waveform": np.concatenate(mine) if mine else np.zeros(0, np.float32),
                          "sample_rate": np.asarray([self.snac.sampling_rate], dtype=np.int32),
                          "finish_reason": req.get("finish_reason"),
                          "speech": req.get("speech")}
        return results
