"""The chat model's CPU steps: pre (validate, chat template, tokenize) and post (detokenize).

pre  turns `messages` (OpenAI-style JSON, tool calls and results included; `tools` rendered by the
     chat template) or a raw `text_input` into token ids, and parses and resolves the sampling
     parameters against the prompt and the context (the checkpoint's generation_config defaults,
     seed, structured output and tool_choice as a grammar), so bad requests fail before decode and
     the AR step takes the resolved form as it is.
post turns the token ids that the AR step releases into text, per channel (content, reasoning, tool
     calls: text/channels.py). It keeps no state: each response carries a few already-sent tokens
     as context, so the new text is decode(context + new) minus decode(context), which is exact at
     the whole-character boundaries the AR step cuts at (text/detokenize.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_omni.ar.defaults import generation_defaults
from triton_omni.ar.sampling import FIELD as SAMPLING, SamplingParams
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register, string_array
from triton_omni.text.channels import MarkerIds
from triton_omni.text.replies import ReplyOptions
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.text.tools import ToolRequest

ROLES = {"system", "user", "assistant", "tool", "developer"}


@dataclass
class ChatPreParams:
    checkpoint: str = ""
    max_model_len: int = 2048
    # bytes of `messages`, `text_input` or `chat_template_kwargs` at most: refused before the tokenizer
    # spends seconds on a prompt that cannot fit the context anyway
    max_messages_bytes: int = 1 << 20


PROMPT_INPUTS = ("text_input", "messages", "chat_template_kwargs", "tools")


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


def parse_messages(raw: Any) -> list[dict[str, Any]]:
    """The messages for the chat template: role and text content, and what a tool-using history
    carries (an assistant's `tool_calls` and `reasoning_content`, a tool result's `tool_call_id`)."""
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("messages", "expected a non-empty JSON list of {role, content} objects")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidInput(f"messages[{i}]", "expected an object with 'role' and 'content'")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:       # a list or a dict is no role (nor hashable)
            raise InvalidInput(f"messages[{i}].role", f"expected one of {sorted(ROLES)}, got {role!r}")
        calls = m.get("tool_calls") if role == "assistant" else None
        if "content" not in m and not calls:
            raise InvalidInput(f"messages[{i}].content", "missing")
        msg: dict[str, Any] = {"role": role, "content": "" if m.get("content") is None else _message_text(i, m["content"])}
        if calls:
            msg["tool_calls"] = ToolRequest.history_calls(calls, f"messages[{i}].tool_calls")
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


@register("chat_pre")
class ChatPreprocess(Step):
    inputs = (
        TensorSpec("text_input", "TYPE_STRING", (1,), optional=True),
        TensorSpec("messages", "TYPE_STRING", (1,), optional=True),
        TensorSpec("prompt_token_ids", "TYPE_INT32", (-1,), optional=True),   # a raw prompt as token ids
        TensorSpec("chat_template_kwargs", "TYPE_STRING", (1,), optional=True),
        TensorSpec("sampling_parameters", "TYPE_STRING", (1,), optional=True),
        # Triton's vLLM backend's: false (or left out when not streaming) puts the prompt before a
        # `text_input` answer; chat answers never repeat their messages
        TensorSpec("exclude_input_in_output", "TYPE_BOOL", (1,), optional=True),
        TensorSpec("stream", "TYPE_BOOL", (1,), optional=True),
        TensorSpec("tools", "TYPE_STRING", (1,), optional=True),             # JSON: OpenAI's tools list
        TensorSpec("tool_choice", "TYPE_STRING", (1,), optional=True),       # "auto", "none", "required", or JSON
        TensorSpec("parallel_tool_calls", "TYPE_BOOL", (1,), optional=True),
    )
    outputs = (
        TensorSpec("input_ids", "TYPE_INT32", (-1,)),
        TensorSpec("sampling", "TYPE_STRING", (1,)),
        TensorSpec("reply_options", "TYPE_STRING", (1,)),
    )
    Params = ChatPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        self.tokenizer = load_tokenizer(folder)
        self.defaults = generation_defaults(folder)
        self.markers = MarkerIds.of(self.tokenizer)
        self._grammar = None

    def grammar(self):
        """The structured-output compiler (built on first use), to refuse a bad grammar here, by name."""
        if self._grammar is None:
            from triton_omni.ar.grammar import GrammarCompiler
            from triton_omni.text.tokenizer import token_byte_table

            self._grammar = GrammarCompiler(token_byte_table(self.tokenizer), len(self.tokenizer),
                                            [self.tokenizer.eos_token_id or 0])
        return self._grammar

    def input_limits(self) -> dict:
        return {"prompt_token_ids": (self.params.max_model_len,)}

    def warmup_inputs(self, spec) -> list[dict]:
        """A chat message of about each `tokens` length (default 16): the template compiles on its first use."""
        return [{"messages": string_array(json.dumps([{"role": "user", "content": " ".join(["warm"] * n)}])),
                 "sampling_parameters": string_array(json.dumps({"max_tokens": 4}))}
                for n in spec.tokens or [16] if n < self.params.max_model_len // 2]

    def check_prompt_sizes(self, req: Request) -> None:
        """Each prompt input within max_messages_bytes, before any of it is parsed."""
        most = self.params.max_messages_bytes
        for name in PROMPT_INPUTS:
            value = req.get(name)
            size = len(value.reshape(-1)[0]) if value is not None and value.size else 0
            if size > most:
                raise InvalidInput(name, f"{size} bytes; at most {most} are accepted")

    def check_messages_only(self, req: Request) -> None:
        """A media chat (images, audio) takes `messages` alone, each prompt input within its size."""
        if req.get("text_input") is not None or req.get("prompt_token_ids") is not None:
            raise InvalidInput("messages", "give exactly one of 'messages', 'text_input' or 'prompt_token_ids'")
        self.check_prompt_sizes(req)

    def render_chat(self, messages: list[dict], req: Request, tools: "ToolRequest") -> str:
        """Parsed `messages` through the chat template, with the request's template kwargs and tools."""
        kwargs = req.json("chat_template_kwargs", {})
        if not isinstance(kwargs, dict):
            raise InvalidInput("chat_template_kwargs", "expected a JSON object")
        if tools.rendered:
            kwargs = {**kwargs, "tools": tools.rendered}
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        except InvalidInput:
            raise
        except Exception as e:  # noqa: BLE001 - the template refused this conversation (jinja's raise_exception)
            raise InvalidInput("messages", f"the chat template cannot render them: {e}") from None

    def prompt_text(self, req: Request, tools: "ToolRequest") -> str | list[int]:
        """The text to tokenize: `text_input` as given, or `messages` through the chat template."""
        self.check_prompt_sizes(req)
        text = req.string("text_input")
        messages = req.json("messages")
        ids = req.get("prompt_token_ids")
        if sum(x is not None for x in (text, messages, ids)) != 1:
            raise InvalidInput("messages", "give exactly one of 'messages', 'text_input' or 'prompt_token_ids'")
        if ids is not None:
            if ids.ndim != 1 or not ids.size or int(ids.min()) < 0 or int(ids.max()) >= len(self.tokenizer):
                raise InvalidInput("prompt_token_ids", f"expected a non-empty list of token ids in [0, {len(self.tokenizer)})")
            return ids.astype(np.int64).tolist()
        if text is not None:
            if not text:
                raise InvalidInput("text_input", "is empty")
            return text
        return self.render_chat(parse_messages(messages), req, tools)

    def request_plan(self, req: Request) -> tuple[str | list[int], SamplingParams, ReplyOptions]:
        """A request's prompt text, its sampling parameters (over the checkpoint's defaults, with the
        grammar that structured output or tool_choice asks for, checked here) and its reply options."""
        tools = ToolRequest.parse(req.json("tools"), req.string("tool_choice"),
                                  req.scalar("parallel_tool_calls", True))
        text = self.prompt_text(req, tools)
        params = SamplingParams.from_dict(req.json(SAMPLING), self.defaults)
        if tools.grammar is not None:
            if params.guided_decoding is not None:
                raise InvalidInput("tool_choice", "cannot be combined with structured output (response_format)")
            params.guided_decoding = tools.grammar
        if params.guided_decoding is not None:
            self.grammar().compile(params.guided_decoding)      # InvalidInput naming what is wrong
        chat = req.get("messages") is not None
        streaming = bool(req.scalar("stream", False))
        # the vLLM backend's clients send exclude_input_in_output=false to get the prompt back (left out,
        # that backend echoes too when not streaming; here left out never echoes)
        echo = not chat and not streaming and req.scalar("exclude_input_in_output", None) is False
        return text, params, ReplyOptions(reasoning=chat and self.markers.reasoning is not None,
                                          tools=tools.parse_calls, echo=echo)

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
        pending: list[tuple[int, str, SamplingParams, ReplyOptions]] = []
        for i, req in enumerate(requests):
            try:
                pending.append((i, *self.request_plan(req)))
            except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
                results[i] = exc
        texts = [text for _, text, _, _ in pending if isinstance(text, str)]
        encoded = iter(self.encode(texts) if texts else [])
        for i, prompt, params, options in pending:
            ids = next(encoded) if isinstance(prompt, str) else prompt
            try:
                if isinstance(ids, BaseException):
                    raise ids
                resolved = params.resolve(len(ids), self.params.max_model_len, len(self.tokenizer))
                results[i] = {"input_ids": np.asarray(ids, dtype=np.int32),
                              "sampling": string_array(json.dumps(resolved.to_dict())),
                              "reply_options": string_array(options.to_json())}
            except Exception as exc:  # noqa: BLE001
                results[i] = exc
        return results


# the post step lives in text/detokenize.py; imported here so `text.chat` keeps registering both steps
from triton_omni.text.detokenize import Detokenize, DetokenizeParams  # noqa: E402,F401
