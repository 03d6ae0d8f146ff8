"""A frame talker as a decoupled step on the AR engine, frames streamed out: the base of the talker
steps of models whose engine step yields a frame of N codes (Qwen3-TTS' `talker_frames`, Fish S2's
`fish_s2_talker`).

The AR step's machinery is reused as is (engine loop thread, delivery thread, aborts and cancellation
checks); only what goes in and comes out differs: a subclass's `submit` turns a request into the
model's prompt, and each response carries the frames [F, N] sampled since the last one (streaming) or
all of them at the end. `speech` is passed along for a codec step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.step import ARDecode, ARParams, Reply, enable_kernels
from triton_omni.runtime.front import ABORT_INPUT
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import string_array
from triton_omni.tts.request import SPEECH


@dataclass
class TalkerFramesParams(ARParams):
    pass


@dataclass(eq=False)
class FrameReply(Reply):
    speech: np.ndarray | None = None


class FrameTalker(ARDecode):
    """Not a step itself: a subclass registers one, sets `load_model` / `model_engine` and `submit`s
    prompts of its model (`self.start(request, FrameReply(...), prompt, params)`)."""
    inputs = (
        TensorSpec("input_ids", "TYPE_INT32", (-1,), optional=True),     # the prompt's tokens (the subclass says which)
        TensorSpec("sampling", "TYPE_STRING", (1,), optional=True),
        TensorSpec("stream", "TYPE_BOOL", (1,), optional=True),
        TensorSpec("speech", "TYPE_STRING", (1,), optional=True),
        TensorSpec(ABORT_INPUT, "TYPE_STRING", (1,), optional=True, control=True),
    )
    outputs = (
        TensorSpec("codes", "TYPE_INT32", (-1, -1)),          # [frames, N], codebook 0 first
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),  # frames so far
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = TalkerFramesParams
    # the model decoded: load_model(folder, device, dtype) -> a frame model (ar/model_runner.FrameModel)
    # and model_engine(model, engine config) -> its LLMEngine
    load_model = None
    model_engine = None

    def make_engine(self, folder) -> LLMEngine:
        p = self.params
        if p.load_format != "auto":
            raise ValueError("load_format must be 'auto'")
        if p.quantization != "none" or p.quantize_lm_head:
            raise ValueError("parameter 'quantization': FP8 weights are for text decoders; this talker takes 'none'")
        self.model = self.load_model(folder, self.ctx.device, torch_dtype(p.dtype))
        enable_kernels(self.ctx.device, p.use_triton_kernels)
        engine = self.model_engine(self.model, p.engine_config())
        if engine.runner.use_graphs:
            engine.runner.capture_graphs()
        return engine

    def warmup_inputs(self, spec) -> list[dict]:
        return []          # a talker's prompt is its model's own (the AR step's random token prompts do not fit)

    # -- the delivery thread ------------------------------------------------------------------
    def _deliver(self, reply: FrameReply, new: list[list[int]], reason: str | None) -> None:
        reply.n_released += len(new)
        if not reply.streaming:
            reply.unsent += new
            if reason is None:
                return
            new, reply.unsent = reply.unsent, []
        elif not new and reason is None:
            return
        self._send(reply, [], new, None, reason)
        if reason is not None:
            self._close(reply)

    def _send(self, reply: FrameReply, context, new: list[list[int]], stop, reason: str | None) -> None:
        self.requests_finished += reason is not None
        reply.sink.send({
            "codes": np.asarray(new, dtype=np.int32).reshape(-1, self.model.num_codes),
            "completion_tokens": np.asarray([reply.n_released], dtype=np.int32),
            "finish_reason": string_array(reason or ""),
            "speech": reply.speech,
        }, final=reason is not None)
