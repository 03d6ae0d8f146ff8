"""Orpheus' pre step: speech inputs -> the talker's prompt ids and sampling, checked up front.

Bad requests fail here, before any decoding: empty or over-long text, an unknown voice, a format
we cannot write, a speed the model cannot speak at, reference audio (no cloning), bad sampling
parameters. The seed is drawn here when the request has none, so the talker's sampling and the
codec's noise use the same one: a request with a seed gets the same audio streamed or not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from triton_omni.ar.sampling import FIELD as SAMPLING, SamplingParams
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register, string_array
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.orpheus.tokens import TOKENS_PER_FRAME, VOICES, OrpheusTokens
from triton_omni.tts.request import SPEECH, SPEECH_INPUTS, Speech, parse_speech, reject_reference

MIN_AUDIO_FRAMES = 12        # a prompt must leave room for about a second of audio


@dataclass
class OrpheusPreParams:
    checkpoint: str = ""
    max_model_len: int = 2048
    voices: list[str] = field(default_factory=lambda: list(VOICES))
    default_voice: str = "tara"
    max_text_chars: int = 4000
    max_tokens: int = 1200              # audio tokens when the request sets none (~14 s at 85 ms / 7 tokens)
    temperature: float = 0.6            # the release's defaults
    top_p: float = 0.8


@register("orpheus_pre")
class OrpheusPre(Step):
    inputs = SPEECH_INPUTS
    outputs = (
        TensorSpec("input_ids", "TYPE_INT32", (-1,)),
        TensorSpec("sampling", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = OrpheusPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        if self.params.default_voice not in self.params.voices:
            raise ValueError(f"default_voice {self.params.default_voice!r} is not among voices {self.params.voices}")
        self.tokenizer = load_tokenizer(ctx.checkpoint(self.params.checkpoint))
        self.tokens = OrpheusTokens.from_tokenizer(self.tokenizer)

    def warmup_inputs(self, spec) -> list[dict]:
        return [{"text": string_array("A short warm-up sentence."), "stream": np.array([True])}]

    def sampling(self, req: Request, prompt_len: int) -> SamplingParams:
        raw = req.json(SAMPLING) or {}
        if isinstance(raw, dict) and "stop" in raw:
            raise InvalidInput(f"{SAMPLING}.stop", "stop strings do not apply to speech")
        if isinstance(raw, dict):
            raw = {"temperature": self.params.temperature, "top_p": self.params.top_p, **raw}
        params = SamplingParams.from_dict(raw)
        params.stop_token_ids = [*params.stop_token_ids, self.tokens.end_of_speech]
        if params.max_tokens is None:
            params.max_tokens = min(self.params.max_tokens, self.params.max_model_len - prompt_len)
        return params.resolve(prompt_len, self.params.max_model_len, len(self.tokenizer))

    def one(self, req: Request) -> dict:
        p = self.params
        speech = parse_speech(req, p.voices, p.default_voice, p.max_text_chars)
        reject_reference(req, p.voices)
        ids = self.tokens.prompt(self.tokenizer, speech.voice, speech.text)
        fits = p.max_model_len - MIN_AUDIO_FRAMES * TOKENS_PER_FRAME
        if len(ids) > fits:
            raise InvalidInput("text", f"is too long: the prompt has {len(ids)} tokens; at most {fits} fit "
                                       f"(the context holds {p.max_model_len}, with room left for audio)")
        params = self.sampling(req, len(ids))
        return {"input_ids": np.asarray(ids, dtype=np.int32),
                "sampling": string_array(json.dumps(params.to_dict())),
                "speech": Speech(params.seed, speech.response_format, speech.stream).tensor()}

