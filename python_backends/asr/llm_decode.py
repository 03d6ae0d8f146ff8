"""The decoder step of the speech-recognition models with an LLM decoder: every segment of a request is
its own sequence on the AR engine (all of them decoding side by side with everyone else's), and the
request's responses give the segments' text in order.

It is `ar_decode_embeds` (ar/embeds_step.py: the audio encoder's rows spliced over the prompt's
placeholder tokens at prefill) with one engine sequence per segment: inputs `input_ids` (every
segment's prompt, one after another), `prompt_lens` (tokens per segment) and `prompt_embeds` (every
segment's audio rows, in order). Each segment's own reply (ar/step.py: streaming, UTF-8 hold-back,
cancellation) sends into a `SegmentedTranscript`, which passes the text on in segment order: the
current segment's tokens at once, a later one's when the segments before it are done.

A model that writes a header before its text (Qwen3-ASR: "language English<asr_text>") names the token
that ends it (`text_marker`); a segment's tokens up to it are its header, never streamed as text, and
come back in the final response (`segment_headers`), where the post step reads the language from them.

Outputs per response: `token_ids` (context + new text tokens) and `num_context`, as the chat steps'
detokenizer takes them; `new_segment` (this piece starts a later segment's text: the post step puts a
space before it) and `first_text` (the transcript's first piece); `streamed`; `finish_reason` ("" until
the last response). The last response adds `segment_token_ids` / `segment_token_counts` (each segment's
text tokens) and `segment_headers` (JSON list).
"""
from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.ar.embeds_step import ARDecodeWithEmbeds, EmbedsARParams
from triton_omni.ar.prompt_embeds import PromptEmbeds, placeholder_index
from triton_omni.ar.sampling import SamplingParams
from triton_omni.ar.step import CONTEXT_TOKENS, Reply
from triton_omni.asr.llm_tensors import DECODE_OUTPUTS, PASSED_ON
from triton_omni.asr.pre import SEGMENT_SPANS
from triton_omni.asr.request import TRANSCRIPTION
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.front import ABORT_INPUT
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, ResponseSink, register, string_array
from triton_omni.text.stream import TokenStream



AUDIO_TOKEN_KEYS = ("audio_token_id", "audio_in_token_idx")     # config.json keys of the audio placeholder


@dataclass
class ASRDecodeParams(EmbedsARParams):
    text_marker: str = ""             # the token that ends a model's header before its text ("" = none)
    max_segments: int = 36000         # a request's segments at most (an hour of 0.1 s pieces)


@dataclass
class _Segment:
    header: list[int] = dataclasses.field(default_factory=list)
    text: list[int] = dataclasses.field(default_factory=list)
    in_header: bool = False
    pending: list[int] = dataclasses.field(default_factory=list)   # text not passed on yet
    reason: str | None = None


class SegmentedTranscript:
    """One request's segments -> its responses, in segment order (called from the delivery thread; the
    lock also covers an error raised on Triton's thread)."""

    def __init__(self, sink: ResponseSink, headers: list[bool], streaming: bool, marker: int | None,
                 token_bytes: list[bytes], passed_on: dict):
        self.sink, self.streaming, self.marker, self.bytes = sink, streaming, marker, token_bytes
        self.passed_on = passed_on          # pre's tensors for post, in every response
        self.segments = [_Segment(in_header=h) for h in headers]
        self.current = 0
        self.context: list[int] = []
        self.text_started = False          # some text with a non-space byte has been passed on
        self.segment_started = False       # ... in the current segment
        self.closed = False
        self.lock = threading.Lock()

    def sink_of(self, k: int) -> ResponseSink:
        transcript = self

        class SegmentSink(ResponseSink):
            def send(self, outputs, final=False):
                new = [int(t) for t in np.asarray(outputs.get("token_ids", [])).reshape(-1)]
                new = new[int(np.asarray(outputs.get("num_context", [0])).reshape(-1)[0]):] if new else []
                reason = str(np.asarray(outputs.get("finish_reason", [""])).reshape(-1)[0] or "") or None
                transcript.push(k, new, reason if final else None, final)

            def error(self, exc):
                transcript.fail(exc)

            def is_cancelled(self):
                return transcript.sink.is_cancelled()

        return SegmentSink()

    def push(self, k: int, new: list[int], reason: str | None, final: bool) -> None:
        with self.lock:
            if self.closed:
                return
            seg = self.segments[k]
            for t in new:
                if seg.in_header:
                    if t == self.marker:
                        seg.in_header = False
                    else:
                        seg.header.append(t)
                else:
                    seg.text.append(t)
                    seg.pending.append(t)
            if final:
                seg.reason = reason or "stop"
            while True:
                if self.streaming and self.current < len(self.segments):
                    self._pass_on(self.segments[self.current])
                if self.current < len(self.segments) and self.segments[self.current].reason is not None:
                    self.current += 1
                    self.segment_started = False
                    continue
                break
            if self.current == len(self.segments):
                self._finish()

    def _pass_on(self, seg: _Segment) -> None:
        """The current segment's pending text as one response (streaming)."""
        if not seg.pending:
            return
        visible = any(self.bytes[t].strip() for t in seg.pending if 0 <= t < len(self.bytes))
        new_segment = visible and not self.segment_started and self.text_started
        first = visible and not self.text_started
        self._send(seg.pending, new_segment, first, final=False)
        self.segment_started |= visible
        self.text_started |= visible
        seg.pending = []

    def _send(self, new: list[int], new_segment: bool, first: bool, final: bool, extra: dict | None = None) -> None:
        self.sink.send({"token_ids": np.asarray(self.context + new, dtype=np.int32),
                        "num_context": np.asarray([len(self.context)], dtype=np.int32),
                        "new_segment": np.asarray([new_segment]), "first_text": np.asarray([first]),
                        "streamed": np.asarray([self.streaming]), **self.passed_on,
                        **(extra or self._final_fields(final))}, final=final)
        self.context = (self.context + new)[-CONTEXT_TOKENS:]

    def _final_fields(self, final: bool) -> dict:
        segs = self.segments if final else []
        reasons = [s.reason for s in self.segments]
        reason = next((r for r in ("cancelled", "error", "abort", "length") if r in reasons), "stop") if final else ""
        headers = [b"".join(self.bytes[t] for t in s.header if 0 <= t < len(self.bytes)).decode("utf-8", "replace")
                   for s in segs]
        return {"finish_reason": string_array(reason),
                "segment_token_ids": np.asarray([t for s in segs for t in s.text], dtype=np.int32),
                "segment_token_counts": np.asarray([len(s.text) for s in segs], dtype=np.int32),
                "segment_headers": string_array(json.dumps(headers, ensure_ascii=False) if final else "")}

    def _finish(self) -> None:
        self.closed = True
        self._send([], False, False, final=True)

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.sink.error(exc)


@register("asr_decode")
class ASRDecode(ARDecodeWithEmbeds):
    inputs = (
        TensorSpec("input_ids", "TYPE_INT32", (-1,), optional=True),
        TensorSpec("prompt_lens", "TYPE_INT32", (-1,), optional=True),
        TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1), optional=True),
        TensorSpec("sampling", "TYPE_STRING", (1,), optional=True),
        TensorSpec("stream", "TYPE_BOOL", (1,), optional=True),
        TensorSpec(SEGMENT_SPANS.name, "TYPE_INT64", (-1, 4), optional=True),
        TensorSpec(TRANSCRIPTION.name, "TYPE_STRING", (1,), optional=True),
        TensorSpec(ABORT_INPUT, "TYPE_STRING", (1,), optional=True, control=True),
    )
    outputs = DECODE_OUTPUTS + (SEGMENT_SPANS, TRANSCRIPTION)
    Params = ASRDecodeParams

    def make_engine(self, folder):
        engine = super().make_engine(folder)
        if not self.placeholders:           # a checkpoint that names its audio token otherwise (Higgs Audio)
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
            self.placeholders = [int(config[k]) for k in AUDIO_TOKEN_KEYS if isinstance(config.get(k), int)][:1]
        marker = self.params.text_marker
        self.marker = None
        if marker:
            from triton_omni.text.tokenizer import load_tokenizer

            ids = load_tokenizer(folder).convert_tokens_to_ids([marker])
            if not ids or ids[0] is None or ids[0] < 0:
                raise ValueError(f"parameter 'text_marker': {marker!r} is not a token of the checkpoint")
            self.marker = int(ids[0])
        return engine

    def input_limits(self) -> dict:
        n, segs = self.params.max_model_len, self.params.max_segments
        return {"input_ids": (n * segs,), "prompt_lens": (segs,), "prompt_embeds": (n * segs, None),
                SEGMENT_SPANS.name: (segs, None)}

    def submit(self, request: Request, sink: ResponseSink) -> None:
        if self.handle_abort(request, sink):
            return
        ids, lens = request.get("input_ids"), request.get("prompt_lens")
        if ids is None or lens is None:
            raise InvalidInput("input_ids" if ids is None else "prompt_lens", "is required")
        ids, lens = np.asarray(ids).reshape(-1).astype(np.int64), np.asarray(lens).reshape(-1).astype(np.int64)
        if (lens <= 0).any() or int(lens.sum()) != ids.size:
            raise InvalidInput("prompt_lens", f"must be > 0 and add up to the {ids.size} input_ids")
        prompts = np.split(ids, np.cumsum(lens)[:-1]) if lens.size else []
        index = [placeholder_index(p, self.placeholders) for p in prompts]
        rows = request.get("prompt_embeds")
        n_rows = sum(i.size for i in index)
        if rows is None and n_rows:
            raise InvalidInput("prompt_embeds", f"the prompts have {n_rows} audio placeholders and no rows for them")
        rows = rows if rows is None or isinstance(rows, torch.Tensor) else torch.from_numpy(np.asarray(rows))
        if rows is not None and (rows.dim() != 2 or rows.shape[0] != n_rows):
            raise InvalidInput("prompt_embeds", f"shape {list(rows.shape)}; expected [{n_rows}, hidden] (one row "
                                                "per audio placeholder of the prompts)")
        params = SamplingParams.from_resolved(request.json("sampling"))
        streaming = bool(request.scalar("stream", False))
        headers = [self.marker is not None and self.marker not in p.tolist() for p in prompts]
        passed_on = {}
        for name in PASSED_ON:
            value = request.get(name)
            if value is None:
                raise InvalidInput(name, "is required (the pre step makes it; the post step reads it)")
            passed_on[name] = np.asarray(value.cpu() if hasattr(value, "cpu") else value)
        if passed_on[SEGMENT_SPANS.name].reshape(-1, 4).shape[0] != len(prompts):
            raise InvalidInput(SEGMENT_SPANS.name, f"{passed_on[SEGMENT_SPANS.name].reshape(-1, 4).shape[0]} segments "
                                                   f"for {len(prompts)} prompts")
        transcript = SegmentedTranscript(sink, headers, streaming, self.marker, self.token_bytes, passed_on)
        if not prompts:                   # silence: no segment, an empty transcript
            transcript._finish()
            return
        parts = rows.split([i.size for i in index]) if rows is not None else [None] * len(prompts)
        embeds = [PromptEmbeds(part, where) if part is not None else None for part, where in zip(parts, index)]
        runner = self.engine.runner
        for prompt, e in zip(prompts, embeds):          # every segment checked before any starts
            if prompt.min() < 0 or prompt.max() >= self.engine.vocab_size:
                raise InvalidInput("input_ids", f"token ids must be in [0, {self.engine.vocab_size})")
            if params.resolved:
                params.check_fits(int(prompt.size), self.params.max_model_len)
            if e is not None:
                e.check(int(prompt.size), runner.hidden_size, runner.rope_axes)
        for k, (prompt, e) in enumerate(zip(prompts, embeds)):
            seg_params = params if params.seed is None else dataclasses.replace(params, seed=(params.seed + k) % 2 ** 63)
            reply = Reply(transcript.sink_of(k), TokenStream(self.token_bytes, []), streaming, int(prompt.size))
            self.start(request, reply, prompt, seg_params, embeds=e)
