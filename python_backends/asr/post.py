"""The CTC models' post step: each segment's best token per frame -> the request's transcript.

Inputs: `frame_ids` and `frame_logprobs` (every segment's frames, one after another), `segment_frames`
(frames per segment), `frame_stride` (samples per frame), and pre's `segment_spans`, `transcription`.
Outputs: `text`, `spoken_language` (the one given: a CTC model detects none), `segments` and `words` (JSON
lists, OpenAI's verbose_json shapes; words only when asked for) and `duration` (seconds of audio).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from triton_omni.asr.ctc import greedy
from triton_omni.asr.pre import SEGMENT_SPANS
from triton_omni.asr.request import TRANSCRIPTION, Options
from triton_omni.asr.segment import from_array
from triton_omni.asr.transcript import Detokenizer, assemble
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register, string_array
from triton_omni.text.tokenizer import load_tokenizer

FRAME_IDS = TensorSpec("frame_ids", "TYPE_INT32", (-1,))
FRAME_LOGPROBS = TensorSpec("frame_logprobs", "TYPE_FP32", (-1,))
SEGMENT_FRAMES = TensorSpec("segment_frames", "TYPE_INT32", (-1,))
FRAME_STRIDE = TensorSpec("frame_stride", "TYPE_INT32", (1,))
OUTPUTS = (TensorSpec("text", "TYPE_STRING", (1,)), TensorSpec("spoken_language", "TYPE_STRING", (1,)),
           TensorSpec("segments", "TYPE_STRING", (1,)), TensorSpec("words", "TYPE_STRING", (1,)),
           TensorSpec("duration", "TYPE_FP32", (1,)))


@dataclass
class CTCPostParams:
    checkpoint: str = ""                # the tokenizer, and config.json's blank_token_id
    max_audio_seconds: float = 3600.0   # bounds the inputs (as pre's)


@register("ctc_post")
class CTCPost(Step):
    inputs = (FRAME_IDS, FRAME_LOGPROBS, SEGMENT_FRAMES, FRAME_STRIDE, SEGMENT_SPANS, TRANSCRIPTION)
    outputs = OUTPUTS
    Params = CTCPostParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        tokenizer = load_tokenizer(folder)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.blank = int(config.get("blank_token_id", tokenizer.pad_token_id or 0))
        self.vocab = len(tokenizer)
        self.detok = Detokenizer(tokenizer)

    def input_limits(self) -> dict:
        frames = int(self.params.max_audio_seconds * 2 * 16000 / 160)    # overlaps counted twice, >= 10 ms frames
        segments = int(self.params.max_audio_seconds * 10)         # pieces are >= 0.1 s
        return {"frame_ids": (frames,), "frame_logprobs": (frames,), "segment_frames": (segments,),
                "segment_spans": (segments, None)}

    def one(self, req: Request) -> dict:
        ids, logprobs, counts = (np.asarray(req.get(n)).reshape(-1) for n in ("frame_ids", "frame_logprobs", "segment_frames"))
        spans = np.asarray(req.get("segment_spans")).reshape(-1, 4)
        stride = int(req.scalar("frame_stride"))
        if counts.size != spans.shape[0]:
            raise InvalidInput("segment_frames", f"{counts.size} segments; segment_spans has {spans.shape[0]}")
        if (counts < 0).any() or int(counts.sum()) != ids.size or logprobs.size != ids.size:
            raise InvalidInput("segment_frames", f"the counts add up to {int(counts.sum())}; frame_ids has {ids.size}, "
                                                 f"frame_logprobs {logprobs.size}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            raise InvalidInput("frame_ids", f"token ids must be in [0, {self.vocab})")
        if stride <= 0:
            raise InvalidInput("frame_stride", f"must be > 0, got {stride}")
        options = Options.from_request(req)
        segments = from_array(spans)
        bounds = np.cumsum([0, *counts.tolist()])
        tokens = [greedy(ids[a:b], self.blank) for a, b in zip(bounds[:-1], bounds[1:])]
        frame_lp = [logprobs[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        out = assemble(segments, tokens, frame_lp, stride, self.detok, options.words, options.temperature)
        return {"text": string_array(out.text), "spoken_language": string_array(options.language),
                "segments": string_array(json.dumps(out.segments, ensure_ascii=False)),
                "words": string_array(json.dumps(out.words, ensure_ascii=False)),
                "duration": np.asarray([options.duration], dtype=np.float32)}
