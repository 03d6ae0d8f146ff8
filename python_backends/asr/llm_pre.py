"""The pre step of the speech-recognition models with an LLM decoder: asr_pre's decoding and segments,
then each segment's decoder prompt, in which the audio encoder's outputs will take the places of a run
of audio placeholder tokens (one per encoder output: the count follows from the segment's length).

A model subclass says what its prompt is around the placeholders (`prompt_parts`: the checkpoint's chat
template with the request's language and prompt) and how many placeholders a segment takes
(`audio_tokens`). Every segment of a request shares the text around its run, so the template is
rendered once per request.

Outputs, besides asr_pre's (`samples`, `segment_spans`, `transcription`): `input_ids` (every segment's
prompt, one after another), `prompt_lens` (tokens per segment's prompt) and `sampling` (the resolved
sampling parameters, JSON: max_tokens per segment, temperature, seed).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from triton_omni.ar.sampling import SamplingParams
from triton_omni.asr.llm_tensors import INPUT_IDS, PROMPT_LENS, SAMPLING
from triton_omni.asr.pre import ASRPre, ASRPreParams
from triton_omni.asr.request import Options
from triton_omni.asr.segment import as_array
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request, StepContext, string_array
from triton_omni.text.tokenizer import load_tokenizer



@dataclass
class LLMASRPreParams(ASRPreParams):
    checkpoint: str = ""
    max_model_len: int = 4096           # as the AR step's: a segment's prompt and transcript fit in it
    max_new_tokens: int = 512           # transcript tokens per segment at most (30 s of speech: ~100-200)
    min_new_tokens: int = 0             # benchmarks: decode at least this many (random weights end anywhere)
    prompt: bool = True
    sampling: bool = True


@dataclass(frozen=True)
class PromptParts:
    """A request's decoder prompt around the audio placeholders: prefix, placeholder id, suffix."""

    prefix: list[int]
    audio_token_id: int
    suffix: list[int]

    def segment(self, n_audio: int) -> list[int]:
        return self.prefix + [self.audio_token_id] * n_audio + self.suffix


class LLMASRPre(ASRPre):
    outputs = ASRPre.outputs + (INPUT_IDS, PROMPT_LENS, SAMPLING)
    Params = LLMASRPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.tokenizer = load_tokenizer(ctx.checkpoint(self.params.checkpoint))

    def prompt_parts(self, options: Options) -> PromptParts:
        raise NotImplementedError

    def audio_tokens(self, samples: int) -> int:
        raise NotImplementedError

    def split(self, ids: list[int], audio_token_id: int) -> PromptParts:
        """A rendered prompt with one placeholder -> its parts."""
        where = [i for i, t in enumerate(ids) if t == audio_token_id]
        if len(where) != 1:
            raise ValueError(f"the chat template rendered {len(where)} audio placeholders; expected 1")
        return PromptParts(ids[:where[0]], audio_token_id, ids[where[0] + 1:])

    def one(self, req: Request) -> dict:
        options, segments, samples = self.prepare(req)
        if options.words:
            raise InvalidInput("timestamp_granularities", "this model gives no word times (segments only)")
        parts = self.prompt_parts(options)
        prompts = [parts.segment(self.audio_tokens(g.length)) for g in segments]
        longest = max((len(p) for p in prompts), default=0)
        p = self.params
        if longest + 1 > p.max_model_len:
            raise InvalidInput("audio", f"a segment's prompt has {longest} tokens; the decoder's context holds "
                                        f"{p.max_model_len} (max_segment_seconds is too long for max_model_len)")
        most = min(p.max_new_tokens, p.max_model_len - max(longest, 1))
        sampling = SamplingParams(max_tokens=most, min_tokens=min(p.min_new_tokens, most),
                                  temperature=options.temperature, seed=None)
        sampling = sampling.resolve(max(longest, 1), p.max_model_len, len(self.tokenizer))
        return {"samples": samples, "segment_spans": as_array(segments), "transcription": options.tensor(),
                "input_ids": np.asarray([t for q in prompts for t in q], dtype=np.int32),
                "prompt_lens": np.asarray([len(q) for q in prompts], dtype=np.int32),
                "sampling": string_array(json.dumps(sampling.to_dict()))}
