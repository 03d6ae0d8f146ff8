"""POST /v1/chat/completions onto a `chat` model: messages (tools, tool results) and sampling in;
content, reasoning_content, tool_calls, logprobs and usage out; n choices.

Streamed answers are `chat.completion.chunk` events: a first chunk per choice with the role, one per
piece (content, reasoning_content or tool_calls delta), a last one per choice with finish_reason
(and, with `stream_options.include_usage`, a usage chunk with no choices), then `data: [DONE]`. The
first Triton response is awaited before answering, so a request the model rejects still gets its
HTTP 400, not a 200 with an error inside. Request fields map onto the model's inputs in chat_fields.py.
"""
from __future__ import annotations

import json
import time
import uuid
from contextlib import aclosing

from fastapi import APIRouter, Request

from triton_omni.client.openai_proxy.chat_fields import param_mapper, sampling_parameters, tool_inputs
from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import ProxyError, bad_field, missing
from triton_omni.client.openai_proxy.fields import Fields, json_body, shown
from triton_omni.client.openai_proxy.media import content_parts
from triton_omni.client.openai_proxy.sse import DONE, event, sse_response
from triton_omni.client.openai_proxy.triton import ClientGone, first_response
from triton_omni.client.tensors import first, text

router = APIRouter()
ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI fields the models cannot honour: refused rather than silently ignored.
UNSUPPORTED = ("functions", "function_call", "audio", "prediction")


async def parse_messages(body: Fields, max_chars: int, allow_urls: bool = False,
                         max_media_bytes: int = 0) -> tuple[list[dict], dict[str, list[bytes]]]:
    """The messages, their text joined, an assistant's tool_calls and reasoning_content and a tool
    result's tool_call_id kept; refused past `max_chars` characters of text in all (the prompt the
    model would tokenize), before anything is sent. A message with images, videos or audio keeps its
    parts, the media's bytes going to the model's `images` / `videos` / `audios` inputs (media.py)."""
    raw = body.raw("messages")
    if raw is None:
        raise missing("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_field("messages", "expected a non-empty list of messages")
    out, chars, media = [], 0, {}
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_field(where, "expected an object with 'role' and 'content'")
        if m.get("role") not in ROLES:
            raise bad_field(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {shown(m.get('role'))}")
        content = m.get("content")
        if isinstance(content, list):
            parts, n = await content_parts(content, where, allow_urls, max_media_bytes, media)
            texts_only = all(p["type"] == "text" for p in parts)
            content = "".join(p["text"] for p in parts) if texts_only else parts
        elif content is None:
            content, n = "", 0
        elif not isinstance(content, str):
            raise bad_field(f"{where}.content", "expected a string or a list of content parts")
        else:
            n = len(content)
        chars += n
        if chars > max_chars:
            raise bad_field("messages", f"the messages have more than {max_chars} characters in all")
        msg = {"role": m["role"], "content": content}
        for key in ("tool_calls", "reasoning_content", "tool_call_id", "name"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    return out, media


def first_part(messages: list[dict], kind: str) -> str:
    """Where the first content part of a media kind is (messages[i].content[j]: parse_messages keeps the parts)."""
    for i, m in enumerate(messages):
        for j, part in enumerate(m["content"] if isinstance(m["content"], list) else []):
            if part.get("type") == kind:
                return f"messages[{i}].content[{j}]"
    return "messages"


def check_unsupported(body: Fields) -> None:
    for name in UNSUPPORTED:
        if body.raw(name):
            raise bad_field(name, "not supported by this server")


def stream_options(body: Fields, stream: bool) -> bool:
    """Whether a streamed answer ends with a usage chunk."""
    options = body.raw("stream_options")
    if options is not None and not stream:
        raise bad_field("stream_options", "only allowed when 'stream' is true")
    if options is not None and not isinstance(options, dict):
        raise bad_field("stream_options", "expected an object")
    include = (options or {}).get("include_usage", False)
    if include is None:
        return False
    if not isinstance(include, bool):
        raise bad_field("stream_options.include_usage", f"must be true or false, got {shown(include)}")
    return include


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    proxy = proxy_of(request)
    body = await json_body(request)
    model_name = body.string("model", required=True)
    settings = proxy.settings
    messages, media = await parse_messages(body, settings.max_text_chars, settings.allow_media_urls,
                                           settings.max_upload_bytes)
    sampling, names = sampling_parameters(body)
    check_unsupported(body)
    stream = body.boolean("stream", default=False)
    include_usage = stream_options(body, stream)
    template_kwargs = body.raw("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise bad_field("chat_template_kwargs", "expected an object")
    mm_kwargs = body.raw("mm_processor_kwargs")           # vLLM's extension, e.g. {"fps": 2}
    if mm_kwargs is not None and not isinstance(mm_kwargs, dict):
        raise bad_field("mm_processor_kwargs", "expected an object")
    model = await proxy.models.resolve("chat", model_name)
    for kind in media:
        if f"{kind}s" not in model.inputs:
            raise bad_field(first_part(messages, kind), f"the model '{model.name}' takes no {kind} content parts")

    values = {"messages": (messages, "BYTES"), "sampling_parameters": (sampling or None, "BYTES"),
              "stream": (stream, "BOOL"), "chat_template_kwargs": (template_kwargs, "BYTES"), **tool_inputs(body),
              "images": (media.get("image"), "BYTES"), "videos": (media.get("video"), "BYTES"),
              "audios": (media.get("audio"), "BYTES"), "mm_processor_kwargs": (mm_kwargs, "BYTES")}
    replies = proxy.gateway.stream(model.name, values, request.is_disconnected, param_mapper(names),
                                   batched=model.batched)
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model.name}
    if not stream:
        return await whole_answer(replies, meta, sampling.get("n", 1))
    first_reply = await first_response(replies)
    return sse_response(stream_chunks(replies, first_reply, meta, include_usage, sampling.get("n", 1)))


class Choice:
    """One sample's answer as it arrives: text, reasoning, tool calls, logprobs, finish."""

    def __init__(self, index: int, call_ids: str):
        self.index, self.call_ids = index, call_ids
        self.content, self.reasoning, self.calls, self.logprobs = [], [], [], []
        self.reason: str | None = None
        self.usage = {}

    def add(self, outputs) -> dict:
        """Take one response; returns its delta (content / reasoning_content / tool_calls)."""
        delta = {}
        piece, thought = text(outputs, "text_output"), text(outputs, "reasoning_output")
        if thought:
            self.reasoning.append(thought)
            delta["reasoning_content"] = thought
        if piece:
            self.content.append(piece)
            delta["content"] = piece
        calls = text(outputs, "tool_calls")
        if calls:
            new = [{"index": len(self.calls) + i, "id": f"call_{self.call_ids}{self.index}_{len(self.calls) + i}",
                    "type": "function", "function": c} for i, c in enumerate(json.loads(calls))]
            self.calls += new
            delta["tool_calls"] = new
        lps = text(outputs, "logprobs")
        if lps:
            self.logprobs += json.loads(lps)
        reason = text(outputs, "finish_reason")
        if reason:
            self.reason = "tool_calls" if self.calls else (reason if reason in ("stop", "length") else "stop")
        self.usage = {k: int(first(outputs, k, 0)) for k in ("prompt_tokens", "completion_tokens", "cached_tokens",
                                                            "reasoning_tokens")}
        return delta

    def message(self) -> dict:
        msg = {"role": "assistant", "content": "".join(self.content) if self.content or not self.calls else None,
               "refusal": None}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            msg["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in self.calls]
        return msg


def usage(choices: list[Choice]) -> dict:
    u = [c.usage for c in choices if c.usage]
    prompt = u[0]["prompt_tokens"] if u else 0
    completion = sum(x["completion_tokens"] for x in u)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": u[0]["cached_tokens"] if u else 0},
            "completion_tokens_details": {"reasoning_tokens": sum(x["reasoning_tokens"] for x in u)}}


def _choices(n: int) -> list[Choice]:
    tag = uuid.uuid4().hex[:12]
    return [Choice(i, tag) for i in range(n)]


def _index(outputs, n: int) -> int:
    i = int(first(outputs, "index", 0))
    return i if 0 <= i < n else 0


async def whole_answer(replies, meta: dict, n: int = 1) -> dict:
    choices = _choices(n)
    async with aclosing(replies):       # a client that leaves: ClientGone, answered 499 by the app
        async for outputs in replies:
            choices[_index(outputs, n)].add(outputs)
    return {"id": meta["id"], "object": "chat.completion", "created": meta["created"], "model": meta["model"],
            "choices": [{"index": c.index, "message": c.message(),
                         "logprobs": {"content": c.logprobs} if c.logprobs else None,
                         "finish_reason": c.reason or "stop"} for c in choices],
            "usage": usage(choices), "system_fingerprint": None}


async def stream_chunks(replies, first_reply, meta: dict, include_usage: bool, n: int = 1):
    """The SSE frames. Runs inside the response: a client that leaves cancels it, and closing
    `replies` (aclosing) closes the Triton stream with cancel_requests=True."""
    head = {"id": meta["id"], "object": "chat.completion.chunk", "created": meta["created"], "model": meta["model"],
            "system_fingerprint": None}
    extra = {"usage": None} if include_usage else {}
    choices = _choices(n)

    def chunk(index: int, delta: dict, reason: str | None = None, logprobs=None) -> bytes:
        return event({**head, "choices": [{"index": index, "delta": delta,
                                           "logprobs": {"content": logprobs} if logprobs else None,
                                           "finish_reason": reason}], **extra})

    async def outputs_in_order():
        yield first_reply
        async for outputs in replies:
            yield outputs

    async with aclosing(replies):
        for c in choices:
            yield chunk(c.index, {"role": "assistant", "content": "", "refusal": None})
        try:
            async for outputs in outputs_in_order():
                c = choices[_index(outputs, n)]
                seen = len(c.logprobs)
                delta = c.add(outputs)
                if delta or len(c.logprobs) > seen:
                    yield chunk(c.index, delta, logprobs=c.logprobs[seen:])
                if c.reason is not None:
                    yield chunk(c.index, {}, c.reason)
        except ProxyError as e:         # after the 200: the error travels as an event
            yield event(e.body())
            yield DONE
            return
        except ClientGone:
            return
        for c in choices:
            if c.reason is None:        # a sample whose end the stream did not carry (cancelled)
                yield chunk(c.index, {}, "stop")
        if include_usage:
            yield event({**head, "choices": [], "usage": usage(choices)})
        yield DONE
