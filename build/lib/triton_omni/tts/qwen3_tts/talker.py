"""`talker_frames`: the Qwen3-TTS talker as a decoupled step on the AR engine, frames streamed out
(tts/frame_talker.py has the engine side): a request's text tokens, language, speaker (and an
instruction, or a cloned voice) become a `TalkerPrompt` of embeddings.
"""
from __future__ import annotations

import torch

from triton_omni.ar.sampling import FIELD, SamplingParams
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, ResponseSink, register
from triton_omni.tts.checks import finite, ids_in_range, whole
from triton_omni.tts.frame_talker import FrameReply, FrameTalker
from triton_omni.tts.qwen3_tts.model import load_qwen3_tts, talker_engine
from triton_omni.tts.request import speech_tensor

# the reference's generate() defaults, for code 0 and the code predictor alike
REFERENCE_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0}
REFERENCE_REPETITION_PENALTY = 1.05


@register("talker_frames")
class TalkerFrames(FrameTalker):
    inputs = (
        FrameTalker.inputs[0],                                           # tokens of model.assistant_text(text)
        TensorSpec("instruct_ids", "TYPE_INT32", (-1,), optional=True),  # tokens of instruct_text(instruction)
        TensorSpec("language", "TYPE_STRING", (1,), optional=True),
        TensorSpec("speaker", "TYPE_STRING", (1,), optional=True),
        TensorSpec("non_streaming", "TYPE_BOOL", (1,), optional=True),   # the whole text in the prompt
        # a cloned voice (Base; python_backends/tts/qwen3_tts/clone.py), empty or absent for none: its
        # x-vector [H]; for ICL the reference's frames [F * N] and the tokens of reference_text(transcript)
        TensorSpec("speaker_embed", "TYPE_FP32", (-1,), optional=True),
        TensorSpec("ref_codes", "TYPE_INT32", (-1,), optional=True),
        TensorSpec("ref_ids", "TYPE_INT32", (-1,), optional=True),
        *FrameTalker.inputs[1:],                                         # sampling, stream, speech, abort
    )
    load_model = staticmethod(load_qwen3_tts)
    model_engine = staticmethod(talker_engine)

    def input_limits(self) -> dict:
        most, n = self.params.max_model_len, self.model.num_codes     # every id and frame takes a position
        return {"input_ids": (most,), "instruct_ids": (most,), "ref_ids": (most,), "ref_codes": (most * n,),
                "speaker_embed": (self.model.talker.codec_head.weight.shape[1],)}

    # -- Triton's thread ----------------------------------------------------------------------
    def submit(self, request: Request, sink: ResponseSink) -> None:
        if self.handle_abort(request, sink):
            return
        model = self.model
        ids = self._ids(request, "input_ids")
        if ids is None or len(ids) < 9:
            raise InvalidInput("input_ids", "expected the tokens of assistant_text(text): 3 role tokens, the "
                                            "text, 5 closing tokens")
        raw = request.json("sampling") or {}
        if not isinstance(raw, dict):
            raise InvalidInput("sampling", "expected a JSON object")
        penalty = raw.pop("repetition_penalty", REFERENCE_REPETITION_PENALTY)
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or penalty <= 0:
            raise InvalidInput(f"{FIELD}.repetition_penalty", f"must be a number > 0, got {penalty!r}")
        params = SamplingParams.from_dict({**REFERENCE_SAMPLING, **raw})
        clone = self._clone(request)
        try:
            with torch.inference_mode():
                prompt = model.build_prompt(ids, request.string("language") or "auto", request.string("speaker"),
                                            self._ids(request, "instruct_ids"),
                                            bool(request.scalar("non_streaming", False)), **clone)
        except ValueError as exc:           # an unknown language or speaker (the message names it)
            raise InvalidInput("language" if str(exc).startswith("language") else "speaker", str(exc)) from None
        prompt.repetition_penalty = float(penalty)
        reply = FrameReply(sink, None, bool(request.scalar("stream", False)), len(prompt),
                            speech=speech_tensor(request))
        self.start(request, reply, prompt, params)

    def _clone(self, request: Request) -> dict:
        """build_prompt's voice-clone arguments from the request (none when the tensors are empty)."""
        model, out = self.model, {}
        w = model.talker.codec_head.weight
        x, codes = (request.get(name) for name in ("speaker_embed", "ref_codes"))   # numpy (CPU input) or torch
        x = torch.as_tensor(x).reshape(-1) if x is not None else torch.zeros(0)
        codes = torch.as_tensor(codes).reshape(-1).long() if codes is not None else torch.zeros(0, dtype=torch.long)
        if x.numel():
            if x.numel() != w.shape[1]:
                raise InvalidInput("speaker_embed", f"expected {w.shape[1]} values, got {x.numel()}")
            finite("speaker_embed", x)
            out["speaker_embed"] = x.to(w.device, w.dtype)
        if codes.numel():
            whole("ref_codes", codes.numel(), model.num_codes)
            ids_in_range("ref_codes", codes, model.codebook_size)
            codes = codes.to(w.device)
            ref_ids = self._ids(request, "ref_ids")
            if ref_ids is None or len(ref_ids) < 6:
                raise InvalidInput("ref_ids", "expected the tokens of reference_text(transcript): 3 role tokens, "
                                              "the transcript, 2 closing tokens")
            out.update(ref_codes=codes.reshape(-1, model.num_codes), ref_ids=ref_ids)
        return out

    def _ids(self, request: Request, name: str) -> list[int] | None:
        ids = request.get(name)
        if ids is None:
            return None
        ids_in_range(name, ids, self.model.config.talker.text_vocab_size)
        return ids.tolist()
