"""Orpheus' codec step: audio tokens -> 24 kHz waveform chunks with SNAC, batched across requests.

Stateless: each talker response carries the tokens of every frame its chunks' windows need (see
talker.py), the running token count and whether the utterance ended. From those the step finds the
chunks to emit (`ChunkPlan`), decodes each chunk's window and keeps the chunk's own samples.

Windows of the same length from all requests in the batch are decoded together, `decode_batch`
rows per call (`ChunkedCodec`, chunking.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, StepContext, register, string_array
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.chunking import ChunkedCodec, ChunkPlan, Window
from triton_omni.tts.orpheus.snac import PositionalNoise, load_snac
from triton_omni.tts.orpheus.tokens import TOKENS_PER_FRAME as TPF, OrpheusTokens, frames_to_codes
from triton_omni.tts.request import SPEECH, Speech


@dataclass
class OrpheusCodecParams:
    checkpoint: str = ""            # the talker's folder: its tokenizer places the audio tokens
    codec_checkpoint: str = ""      # the SNAC folder (config.json + pytorch_model.bin)
    max_model_len: int = 2048       # the talker's context: no reply has more tokens
    dtype: str = "float32"
    first_chunk_frames: int = 2
    chunk_frames: int = 8
    decode_batch: int = 4           # windows per decoder call (fixed: see ChunkedCodec)
    pad_rows: str = "fixed"         # "fixed" | "pow2" (see ChunkedCodec)


@register("orpheus_codec")
class OrpheusCodec(ChunkedCodec):
    inputs = (
        TensorSpec("token_ids", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("num_context", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = OrpheusCodecParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        self.audio_start = OrpheusTokens.from_tokenizer(load_tokenizer(ctx.checkpoint(p.checkpoint))).audio_start
        self.snac = load_snac(ctx.checkpoint(p.codec_checkpoint), ctx.device, self.dtype)
        self.sample_rate, self.frame_samples = self.snac.sampling_rate, self.snac.frame_samples
        left, right = self.snac.context_frames()
        self.plan = ChunkPlan(p.first_chunk_frames, p.chunk_frames, left, right)

    def input_limits(self) -> dict:
        return {"token_ids": (self.params.max_model_len,)}     # a non-streamed reply's tokens, all at once

    def warmup_inputs(self, spec) -> list[dict]:
        """A streamed utterance's tokens in one final response: its first chunk and two after it decode."""
        p = self.params
        n = TPF * (p.first_chunk_frames + 2 * p.chunk_frames + self.plan.right)
        i32 = lambda v: np.array([v], np.int32)  # noqa: E731
        return [{"token_ids": np.random.default_rng(0).integers(0, 1 << 16, n, dtype=np.int32), "num_context": i32(0),
                 "completion_tokens": i32(n), "finish_reason": string_array("length"),
                 "speech": Speech(0, "pcm", True).tensor()}]

    def windows(self, index: int, req: Request) -> list[Window]:
        ids = req.get("token_ids")
        ids = ids.cpu().numpy() if hasattr(ids, "cpu") else ids     # a GPU step may be handed torch tensors
        # a token outside the audio range decodes as code 0 (tokens.frames_to_codes): no range to check
        return self.plan_windows(index, req, ids, TPF, self.params.max_model_len, Speech.from_request(req).seed)

    def decode_rows(self, rows: list[Window]) -> np.ndarray:
        codes = [c.to(self.ctx.device) for c in frames_to_codes(np.stack([w.data for w in rows]),
                                                                self.audio_start, self.snac.codebook_size)]
        noise = PositionalNoise(torch.tensor([w.seed for w in rows]),
                                torch.tensor([w.start * self.snac.frame_steps for w in rows]))
        return self.snac.decode(codes, noise)[:, 0].float().cpu().numpy()
