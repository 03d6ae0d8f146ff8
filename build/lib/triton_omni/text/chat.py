"""The chat model's CPU steps: pre (validate, chat template, tokenize) and post (detokenize).

pre  turns `messages` (OpenAI-style JSON) or a raw `text_input` into token ids, and parses and
     resolves the sampling parameters against the prompt and the context (defaults, seed), so bad
     requests fail before decode and the AR step takes the resolved form as it is.
post turns the token ids that the AR step releases into text. It keeps no state: each response
     carries a few already-sent tokens as context, so the new text is decode(context + new) minus
     decode(context), which is exact at the whole-character boundaries the AR step cuts at.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_omni.ar.sampling import FIELD as SAMPLING, SamplingParams
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register, string_array
from triton_omni.text.tokenizer import load_tokenizer

ROLES = {"system", "user", "assistant", "tool", "developer"}


@dataclass
class ChatPreParams:
    checkpoint: str = ""
    max_model_len: int = 2048
    # bytes of `messages`, `text_input` or `chat_template_kwargs` at most: refused before the tokenizer
    # spends seconds on a prompt that cannot fit the context anyway
    max_messages_bytes: int = 1 << 20


PROMPT_INPUTS = ("text_input", "messages", "chat_template_kwargs")


def _message_text(i: int, content: Any) -> str:
    """OpenAI content: a string, or a list of parts of which text parts are kept."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidInput(f"messages[{i}].content[{j}]", "only text parts are supported by this model")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidInput(f"messages[{i}].content", "expected a string or a list of content parts")


def parse_messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("messages", "expected a non-empty JSON list of {role, content} objects")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidInput(f"messages[{i}]", "expected an object with 'role' and 'content'")
        role = m.get("role")
        if role not in ROLES:
            raise InvalidInput(f"messages[{i}].role", f"expected one of {sorted(ROLES)}, got {role!r}")
        if "content" not in m:
            raise InvalidInput(f"messages[{i}].content", "missing")
        out.append({"role": role, "content": _message_text(i, m["content"])})
    return out


@register("chat_pre")
class ChatPreprocess(Step):
    inputs = (
        TensorSpec("text_input", "TYPE_STRING", (1,), optional=True),
        TensorSpec("messages", "TYPE_STRING", (1,), optional=True),
        TensorSpec("chat_template_kwargs", "TYPE_STRING", (1,), optional=True),
        TensorSpec("sampling_parameters", "TYPE_STRING", (1,), optional=True),
        # sent by genai-perf (--backend vllm); the prompt is never echoed, so it changes nothing
        TensorSpec("exclude_input_in_output", "TYPE_BOOL", (1,), optional=True),
    )
    outputs = (
        TensorSpec("input_ids", "TYPE_INT32", (-1,)),
        TensorSpec("sampling", "TYPE_STRING", (1,)),
    )
    Params = ChatPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.tokenizer = load_tokenizer(ctx.checkpoint(self.params.checkpoint))

    def warmup_inputs(self, spec) -> list[dict]:
        """A chat message of about each `tokens` length (default 16): the template compiles on its first use."""
        return [{"messages": string_array(json.dumps([{"role": "user", "content": " ".join(["warm"] * n)}])),
                 "sampling_parameters": string_array(json.dumps({"max_tokens": 4}))}
                for n in spec.tokens or [16] if n < self.params.max_model_len // 2]

    def prompt_text(self, req: Request) -> str:
        """The text to tokenize: `text_input` as given, or `messages` through the chat template."""
        most = self.params.max_messages_bytes
        for name in PROMPT_INPUTS:
            value = req.get(name)
            size = len(value.reshape(-1)[0]) if value is not None and value.size else 0
            if size > most:
                raise InvalidInput(name, f"{size} bytes; at most {most} are accepted")
        text = req.string("text_input")
        messages = req.json("messages")
        if (text is None) == (messages is None):
            raise InvalidInput("messages", "give exactly one of 'messages' or 'text_input'")
        if text is not None:
            if not text:
                raise InvalidInput("text_input", "is empty")
            return text
        kwargs = req.json("chat_template_kwargs", {})
        if not isinstance(kwargs, dict):
            raise InvalidInput("chat_template_kwargs", "expected a JSON object")
        return self.tokenizer.apply_chat_template(parse_messages(messages), add_generation_prompt=True,
                                                  tokenize=False, **kwargs)

    def encode(self, texts: list[str]) -> list[list[int] | BaseException]:
        """All of a batch's texts in one tokenizer call: the Rust tokenizer spreads a batch over its
        threads (64 prompts of 512 letters on a 2-core machine: 6-12 ms against 10-13 ms one call a
        prompt). Special tokens are not added: a chat template writes its own."""
        try:
            return self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        except Exception:  # noqa: BLE001 - find the text that fails; the others still go on
            out: list[list[int] | BaseException] = []
            for text in texts:
                try:
                    out.append(self.tokenizer.encode(text, add_special_tokens=False))
                except Exception as exc:  # noqa: BLE001
                    out.append(exc)
            return out

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        """Each request's text and sampling checked on its own, then one tokenizer call for the batch,
        then the sampling resolved against each prompt's length; a failure stays its request's."""
        results: list[dict | BaseException | None] = [None] * len(requests)
        pending: list[tuple[int, str, SamplingParams]] = []
        for i, req in enumerate(requests):
            try:
                pending.append((i, self.prompt_text(req), SamplingParams.from_dict(req.json(SAMPLING))))
            except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
                results[i] = exc
        encoded = self.encode([text for _, text, _ in pending]) if pending else []
        for (i, _, params), ids in zip(pending, encoded):
            try:
                if isinstance(ids, BaseException):
                    raise ids
                resolved = params.resolve(len(ids), self.params.max_model_len, len(self.tokenizer))
                results[i] = {"input_ids": np.asarray(ids, dtype=np.int32),
                              "sampling": string_array(json.dumps(resolved.to_dict()))}
            except Exception as exc:  # noqa: BLE001
                results[i] = exc
        return results


@dataclass
class DetokenizeParams:
    checkpoint: str = ""
    max_model_len: int = 2048          # the AR step's context: no response carries more tokens


@register("detokenize")
class Detokenize(Step):
    inputs = (
        TensorSpec("token_ids", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("num_context", "TYPE_INT32", (1,)),
        TensorSpec("stop_text", "TYPE_STRING", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        TensorSpec("prompt_tokens", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
    )
    outputs = (
        TensorSpec("text_output", "TYPE_STRING", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        TensorSpec("prompt_tokens", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
    )
    Params = DetokenizeParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.tokenizer = load_tokenizer(ctx.checkpoint(self.params.checkpoint))

    def text(self, ids: list[int], num_context: int, stop: str) -> str:
        decode = lambda t: self.tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
        full = decode(ids)
        prefix = decode(ids[:num_context]) if num_context else ""
        new = full[len(prefix):] if full.startswith(prefix) else decode(ids[num_context:])
        if stop:
            cut = new.find(stop)
            new = new if cut < 0 else new[:cut]
        return new

    def input_limits(self) -> dict:
        return {"token_ids": (self.params.max_model_len,)}

    def warmup_inputs(self, spec) -> list[dict]:
        one = lambda v: np.array([v], dtype=np.int32)  # noqa: E731
        ids = np.random.default_rng(0).integers(0, len(self.tokenizer), 8, dtype=np.int32)
        return [{"token_ids": ids, "num_context": one(4), "stop_text": string_array(""),
                 "finish_reason": string_array(""), "prompt_tokens": one(16), "completion_tokens": one(8)}]

    def one(self, req: Request) -> dict:
        ids = req.get("token_ids")
        if ids.size and int(ids.min()) < 0:           # the tokenizer takes unsigned ids (an id past its vocabulary is skipped)
            raise InvalidInput("token_ids", f"token ids must be >= 0, got {int(ids.min())}")
        num_context = int(req.scalar("num_context"))
        if not 0 <= num_context <= ids.size:
            raise InvalidInput("num_context", f"must be in [0, {ids.size}] (the tokens sent), got {num_context}")
        text = self.text(ids.tolist(), num_context, req.string("stop_text"))
        return {"text_output": string_array(text), "finish_reason": req.get("finish_reason"),
                "prompt_tokens": req.get("prompt_tokens"), "completion_tokens": req.get("completion_tokens")}
