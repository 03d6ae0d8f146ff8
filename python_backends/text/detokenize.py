"""The chat models' post step: released token ids -> text, per channel, stateless.

Each response of the AR step carries a few already-sent tokens as context, so a run of new tokens'
text is decode(before + run) minus decode(before), exact at the whole-character boundaries the AR
step cuts at. The runs are split by channel (text/channels.py): content goes to `text_output`,
reasoning to `reasoning_output`, each tool call (sent whole) is parsed into `tool_calls`, markers
are dropped. Logprobs (token ids and values) become OpenAI's per-token objects.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register, string_array
from triton_omni.text.channels import CONTENT, MARKER, REASONING, TOOL
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.text.tools import parse_call


@dataclass
class DetokenizeParams:
    checkpoint: str = ""
    max_model_len: int = 2048          # the AR step's context: no response carries more tokens


PASSED = ("finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens", "index")


@register("detokenize")
class Detokenize(Step):
    inputs = (
        TensorSpec("token_ids", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("num_context", "TYPE_INT32", (1,)),
        TensorSpec("stop_text", "TYPE_STRING", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        TensorSpec("prompt_tokens", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
        TensorSpec("token_channels", "TYPE_INT32", (-1,), optional=True, ragged=True),
        TensorSpec("index", "TYPE_INT32", (1,), optional=True),
        TensorSpec("cached_tokens", "TYPE_INT32", (1,), optional=True),
        TensorSpec("reasoning_tokens", "TYPE_INT32", (1,), optional=True),
        TensorSpec("token_logprobs", "TYPE_STRING", (1,), optional=True),
    )
    outputs = (
        TensorSpec("text_output", "TYPE_STRING", (1,)),
        TensorSpec("reasoning_output", "TYPE_STRING", (1,)),
        TensorSpec("tool_calls", "TYPE_STRING", (1,)),          # JSON list of {name, arguments}; "" when none
        TensorSpec("logprobs", "TYPE_STRING", (1,)),            # JSON list of OpenAI token logprobs; "" when not asked
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        TensorSpec("prompt_tokens", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
        TensorSpec("cached_tokens", "TYPE_INT32", (1,)),
        TensorSpec("reasoning_tokens", "TYPE_INT32", (1,)),
        TensorSpec("index", "TYPE_INT32", (1,)),
    )
    Params = DetokenizeParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.tokenizer = load_tokenizer(ctx.checkpoint(self.params.checkpoint))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def text(self, ids: list[int], num_context: int, stop: str) -> str:
        """The text of ids[num_context:] after ids[:num_context], cut at the stop string."""
        full = self.decode(ids)
        prefix = self.decode(ids[:num_context]) if num_context else ""
        new = full[len(prefix):] if full.startswith(prefix) else self.decode(ids[num_context:])
        if stop:
            cut = new.find(stop)
            new = new if cut < 0 else new[:cut]
        return new

    def input_limits(self) -> dict:
        n = self.params.max_model_len
        return {"token_ids": (n,), "token_channels": (n,)}

    def warmup_inputs(self, spec) -> list[dict]:
        one = lambda v: np.array([v], dtype=np.int32)  # noqa: E731
        ids = np.random.default_rng(0).integers(0, len(self.tokenizer), 8, dtype=np.int32)
        plain = {"token_ids": ids, "num_context": one(4), "stop_text": string_array(""),
                 "finish_reason": string_array(""), "prompt_tokens": one(16), "completion_tokens": one(8)}
        channels = np.array([REASONING] * 4 + [CONTENT] * 4, dtype=np.int32)      # a chat answer's split
        return [plain, {**plain, "token_channels": channels}]

    def split(self, ids: list[int], channels: list[int], num_context: int, stop: str) -> dict[int, list[str]]:
        """The new tokens' text per channel, run by run (a tool call's run is one call's body)."""
        out: dict[int, list[str]] = {CONTENT: [], REASONING: [], TOOL: []}
        i = num_context
        while i < len(ids):
            j = i
            while j < len(ids) and channels[j] == channels[i]:
                j += 1
            if channels[i] != MARKER:
                start = i
                while start > max(0, i - 4) and channels[start - 1] not in (MARKER,):
                    start -= 1
                out[channels[i]].append(self.text(ids[start:j], i - start, stop if channels[i] == CONTENT else ""))
            i = j
        return out

    def one(self, req: Request) -> dict:
        ids = req.get("token_ids")
        if ids.size and int(ids.min()) < 0:           # the tokenizer takes unsigned ids (an id past its vocabulary is skipped)
            raise InvalidInput("token_ids", f"token ids must be >= 0, got {int(ids.min())}")
        num_context = int(req.scalar("num_context"))
        if not 0 <= num_context <= ids.size:
            raise InvalidInput("num_context", f"must be in [0, {ids.size}] (the tokens sent), got {num_context}")
        channels = req.get("token_channels")
        stop = req.string("stop_text")
        tool_calls, reasoning = [], ""
        if channels is None or not channels.size or not channels.any():
            text = self.text(ids.tolist(), num_context, stop)
        else:
            if channels.shape != ids.shape or int(channels.min()) < 0 or int(channels.max()) > MARKER:
                raise InvalidInput("token_channels", f"expected one channel in [0, {MARKER}] per token id")
            parts = self.split(ids.tolist(), channels.tolist(), num_context, stop)
            text, reasoning = "".join(parts[CONTENT]), "".join(parts[REASONING])
            for body in parts[TOOL]:
                call = parse_call(body.strip())
                if call is None:              # not a call after all: the model's text, as it wrote it
                    text += f"<tool_call>{body}</tool_call>"
                else:
                    tool_calls.append(call)
        out = {"text_output": string_array(text), "reasoning_output": string_array(reasoning),
               "tool_calls": string_array(json.dumps(tool_calls) if tool_calls else ""),
               "logprobs": string_array(self.logprobs(req.string("token_logprobs", "")))}
        for name in PASSED:
            value = req.get(name)
            out[name] = value if value is not None else np.zeros(1, dtype=np.int32)
        return out

    def logprobs(self, raw: str) -> str:
        """[[id, logprob, [[id, logprob]...]]...] -> OpenAI's [{token, logprob, bytes, top_logprobs}]."""
        if not raw:
            return ""
        try:
            entries = json.loads(raw)
            out = [{**self._token(t, lp), "top_logprobs": [self._token(a, b) for a, b in top]} for t, lp, top in entries]
        except (ValueError, TypeError) as e:
            raise InvalidInput("token_logprobs", f"expected [[id, logprob, [[id, logprob]...]]...]: {e}") from None
        return json.dumps(out)

    def _token(self, tid: int, logprob: float) -> dict:
        text = self.tokenizer.convert_tokens_to_string([self.tokenizer.convert_ids_to_tokens(int(tid))])
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8"))}
