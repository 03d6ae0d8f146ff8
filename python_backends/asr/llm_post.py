"""The post step of the speech-recognition models with an LLM decoder: each response of asr_decode
(asr/llm_decode.py) -> a piece of text, and with the last one the transcript's segments and language.

It runs once per streamed response and keeps nothing between them: a piece is the detokenized new
tokens after their context (the tokens sent before, as the chat detokenizer does), with a space before
a later segment's first piece and the transcript's first piece left-stripped. Joined, the pieces are
the text a request without streaming gets in one response (its segments' texts, each left-stripped,
joined by spaces).

Outputs (the transcription route's): `text` (this piece), and on the last response `spoken_language`
(the one given, else what the model detected: `language_of`), `segments` (JSON: each segment of audio
with its text and tokens, start and end: the LLM gives no times of its own, so a segment spans the
audio its piece of the request covers), `words` ("[]": no word times) and `duration`.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import numpy as np

from triton_omni.asr.llm_tensors import DECODE_OUTPUTS
from triton_omni.asr.post import OUTPUTS
from triton_omni.asr.pre import SEGMENT_SPANS
from triton_omni.asr.request import TRANSCRIPTION, Options
from triton_omni.asr.segment import RATE, from_array
from triton_omni.asr.transcript import compression_ratio
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request, Step, StepContext, register, string_array
from triton_omni.text.tokenizer import load_tokenizer


@dataclass
class LLMASRPostParams:
    checkpoint: str = ""                # the tokenizer
    max_model_len: int = 4096
    max_audio_seconds: float = 3600.0


@register("asr_llm_post")
class LLMASRPost(Step):
    inputs = DECODE_OUTPUTS + (SEGMENT_SPANS, TRANSCRIPTION)
    outputs = OUTPUTS
    Params = LLMASRPostParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.tokenizer = load_tokenizer(ctx.checkpoint(self.params.checkpoint))

    def input_limits(self) -> dict:
        segments = int(self.params.max_audio_seconds * 10)
        return {"token_ids": (self.params.max_model_len,), "segment_token_ids": (self.params.max_model_len * segments,),
                "segment_token_counts": (segments,), "segment_spans": (segments, None)}

    def language_of(self, headers: list[str]) -> str:
        """The language a model detected, from its segments' headers ("" when it says none)."""
        return ""

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def piece(self, req: Request) -> str:
        ids = np.asarray(req.get("token_ids")).reshape(-1)
        if ids.size and int(ids.min()) < 0:
            raise InvalidInput("token_ids", f"token ids must be >= 0, got {int(ids.min())}")
        num_context = int(req.scalar("num_context", 0))
        if not 0 <= num_context <= ids.size:
            raise InvalidInput("num_context", f"must be in [0, {ids.size}] (the tokens sent), got {num_context}")
        full, prefix = self.decode(ids), self.decode(ids[:num_context]) if num_context else ""
        new = full[len(prefix):] if full.startswith(prefix) else self.decode(ids[num_context:])
        if bool(req.scalar("first_text", False)):
            new = new.lstrip()
        elif bool(req.scalar("new_segment", False)):
            new = " " + new.lstrip()
        return new

    def one(self, req: Request) -> dict:
        options = Options.from_request(req)
        reason = req.string("finish_reason") or ""
        text = self.piece(req) if bool(req.scalar("streamed", False)) else ""
        empty = {"spoken_language": string_array(""), "segments": string_array(""), "words": string_array(""),
                 "duration": np.asarray([options.duration], dtype=np.float32)}
        if not reason:
            return {"text": string_array(text), **empty}
        spans = from_array(np.asarray(req.get("segment_spans")).reshape(-1, 4))
        counts = np.asarray(req.get("segment_token_counts")).reshape(-1).astype(np.int64)
        ids = np.asarray(req.get("segment_token_ids")).reshape(-1)
        headers = req.json("segment_headers", []) or []
        if counts.size != len(spans) or int(counts.sum()) != ids.size or (counts < 0).any():
            raise InvalidInput("segment_token_counts", f"{counts.size} counts adding up to {int(counts.sum())} for "
                                                       f"{len(spans)} segments and {ids.size} tokens")
        if not isinstance(headers, list) or len(headers) != len(spans):
            raise InvalidInput("segment_headers", f"expected a JSON list of {len(spans)} strings")
        bounds = np.cumsum([0, *counts.tolist()])
        segments, texts = [], []
        for seg, a, b in zip(spans, bounds[:-1], bounds[1:]):
            raw = self.decode(ids[a:b])
            piece = raw.strip()
            if piece:
                texts.append(raw.lstrip())
            segments.append({"id": len(segments), "seek": int(seg.start * 100 // RATE),
                             "start": round(seg.start / RATE, 3), "end": round(seg.end / RATE, 3), "text": piece,
                             "tokens": ids[a:b].tolist(), "temperature": options.temperature, "avg_logprob": 0.0,
                             "compression_ratio": compression_ratio(piece), "no_speech_prob": 0.0})
        if not bool(req.scalar("streamed", False)):
            text = " ".join(texts)          # as the streamed pieces join
        language = options.language or self.language_of([str(h) for h in headers])
        return {"text": string_array(text), "spoken_language": string_array(language),
                "segments": string_array(json.dumps(segments, ensure_ascii=False)), "words": string_array("[]"),
                "duration": np.asarray([options.duration], dtype=np.float32)}


def most_common(values: list[str]) -> str:
    """The most frequent non-empty value ("" if none)."""
    counted = Counter(v for v in values if v)
    return counted.most_common(1)[0][0] if counted else ""
