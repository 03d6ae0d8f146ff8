"""The talker: the AR decode step (its engine and delivery unchanged) with a sink that shapes its
stream for a codec step.

A step after a streaming step runs once per streamed response and sees only that response's
tensors, so everything the codec needs travels in each response, and the talker sends a response
only when the codec can emit audio with it:

- held back: released tokens are forwarded only when the next chunk's lookahead frames exist
  (`ChunkPlan.ready_end` grows) or the reply ends, so no response carries no audio;
- context: each response repeats the already-sent tokens from the first frame the codec's window
  needs (the chunk's left context), so the codec step keeps no state;
- `speech` (seed, format, stream from pre) is passed along with every response.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_omni.ar.step import ARDecode, ARParams
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, ResponseSink, StepContext, register
from triton_omni.tts.chunking import ChunkPlan
from triton_omni.tts.orpheus.snac import SNACDecoder, read_config
from triton_omni.tts.orpheus.tokens import TOKENS_PER_FRAME
from triton_omni.tts.request import SPEECH, speech_tensor


@dataclass
class TalkerParams(ARParams):
    codec_checkpoint: str = ""      # the codec folder: its receptive field sets the context
    first_chunk_frames: int = 2
    chunk_frames: int = 8


def chunk_plan(codec_folder, first: int, size: int) -> ChunkPlan:
    """The plan for a SNAC codec folder (its config alone: the layers are built on the meta device)."""
    import torch

    with torch.device("meta"):
        left, right = SNACDecoder(read_config(codec_folder)).context_frames()
    return ChunkPlan(first, size, left, right)


class ChunkedSink(ResponseSink):
    """Wraps one request's sink: turns the AR step's responses into codec-ready ones."""

    def __init__(self, inner: ResponseSink, plan: ChunkPlan, speech: np.ndarray, streaming: bool):
        self.inner, self.plan, self.speech, self.streaming = inner, plan, speech, streaming
        self.tokens: list[int] = []       # every token released so far
        self.sent = 0                     # how many of them went out

    def send(self, outputs: dict[str, Any], final: bool = False) -> None:
        if "token_ids" not in outputs:    # an abort's empty acknowledgement
            self.inner.send(outputs, final)
            return
        ids = outputs["token_ids"]
        self.tokens += ids[int(outputs["num_context"][0]):].tolist()
        frames = lambda n: n // TOKENS_PER_FRAME  # noqa: E731
        if not final and self.plan.ready_end(frames(len(self.tokens))) <= self.plan.ready_end(frames(self.sent)):
            return                        # nothing new to play yet
        start = TOKENS_PER_FRAME * self.plan.context_start(frames(self.sent)) if self.streaming else 0
        self.inner.send({
            "token_ids": np.asarray(self.tokens[start:], dtype=np.int32),
            "num_context": np.asarray([self.sent - start], dtype=np.int32),
            "completion_tokens": np.asarray([len(self.tokens)], dtype=np.int32),
            "finish_reason": outputs["finish_reason"],
            "speech": self.speech,
        }, final)
        self.sent = len(self.tokens)

    def error(self, exc: BaseException) -> None:
        self.inner.error(exc)

    def is_cancelled(self) -> bool:
        return self.inner.is_cancelled()


@register("talker_decode")
class TalkerDecode(ARDecode):
    inputs = tuple(t for t in ARDecode.inputs if t.name != "reply_options") + (SPEECH,)   # a chat answer's options
    outputs = (
        TensorSpec("token_ids", "TYPE_INT32", (-1,)),
        TensorSpec("num_context", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = TalkerParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.plan = chunk_plan(ctx.checkpoint(self.params.codec_checkpoint), self.params.first_chunk_frames,
                               self.params.chunk_frames)

    def wrap_sink(self, request: Request, sink: ResponseSink) -> ResponseSink:
        return ChunkedSink(sink, self.plan, speech_tensor(request), bool(request.scalar("stream", False)))

