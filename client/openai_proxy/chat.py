"""POST /v1/chat/completions onto a `chat` model: messages + sampling_parameters in, text out.

Streamed answers are `chat.completion.chunk` events: a first chunk with the role, one per text
piece, a last one with finish_reason (and, with `stream_options.include_usage`, a usage chunk with
no choices), then `data: [DONE]`. The first Triton response is awaited before answering, so a
request the model rejects still gets its HTTP 400, not a 200 with an error inside.
"""
from __future__ import annotations

import time
import uuid
from contextlib import aclosing

from fastapi import APIRouter, Request

from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import ProxyError, bad_field, missing
from triton_omni.client.openai_proxy.fields import INT32_MAX, INT64_MAX, INT64_MIN, Fields, json_body, shown
from triton_omni.client.openai_proxy.media import content_parts
from triton_omni.client.openai_proxy.sse import DONE, event, sse_response
from triton_omni.client.openai_proxy.triton import ClientGone, first_response
from triton_omni.client.tensors import first, text

router = APIRouter()
ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI fields the models cannot honour: refused rather than silently ignored.
UNSUPPORTED = ("tools", "functions", "audio", "prediction", "logit_bias")


async def parse_messages(body: Fields, max_chars: int, allow_urls: bool = False,
                         max_media_bytes: int = 0) -> tuple[list[dict], dict[str, list[bytes]]]:
    """The messages, text parts joined (a message with images or videos keeps its parts, the media's
    bytes going to the model's `images` / `videos` inputs: media.py); refused past `max_chars`
    characters of text in all (the prompt the model would tokenize), before anything is sent."""
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
        out.append({"role": m["role"], "content": content})
    return out, media


def sampling_parameters(body: Fields) -> tuple[dict, str]:
    """OpenAI's sampling fields -> the model's `sampling_parameters`; also which field set the length."""
    length_field = "max_completion_tokens" if body.has("max_completion_tokens") else "max_tokens"
    p = {"max_tokens": body.number(length_field, lo=1, integer=True),
         "temperature": body.number("temperature", lo=0, hi=2),
         "top_p": body.number("top_p", lo=0, hi=1, lo_open=True),
         "seed": body.number("seed", lo=INT64_MIN, hi=INT64_MAX, integer=True),
         # extensions that vLLM's OpenAI server also takes
         "top_k": body.number("top_k", lo=-1, integer=True),
         "ignore_eos": body.boolean("ignore_eos")}
    stop = body.raw("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise bad_field("stop", "expected a non-empty string or a list of up to 4 of them")
        p["stop"] = stop
    ids = body.raw("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(type(t) is int and 0 <= t <= INT32_MAX for t in ids):
            raise bad_field("stop_token_ids", f"expected a list of token ids (integers in [0, {INT32_MAX}])")
        p["stop_token_ids"] = ids
    return {k: v for k, v in p.items() if v is not None}, length_field


def check_unsupported(body: Fields) -> None:
    n = body.number("n", lo=1, integer=True, default=1)
    if n != 1:
        raise bad_field("n", f"only n=1 is supported, got {n}")
    for name in UNSUPPORTED:
        if body.raw(name):
            raise bad_field(name, "not supported by this server")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.number(name, lo=-2, hi=2, default=0) != 0:
            raise bad_field(name, "not supported by this server (only 0)")
    if body.boolean("logprobs"):
        raise bad_field("logprobs", "not supported by this server")
    fmt = body.raw("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise bad_field("response_format", "only {'type': 'text'} is supported")


def param_mapper(length_field: str):
    """The model's field names (sampling_parameters.top_p, prompt) -> the request's (top_p, messages)."""
    def param_of(field: str) -> str:
        if field.startswith("sampling_parameters."):
            name = field.split(".", 1)[1]
            return length_field if name == "max_tokens" else name
        if field == "prompt":
            return "messages"
        return field
    return param_of


def usage(outputs) -> dict:
    prompt, completion = int(first(outputs, "prompt_tokens", 0)), int(first(outputs, "completion_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    proxy = proxy_of(request)
    body = await json_body(request)
    model_name = body.string("model", required=True)
    settings = proxy.settings
    messages, media = await parse_messages(body, settings.max_text_chars, settings.allow_media_urls,
                                           settings.max_upload_bytes)
    sampling, length_field = sampling_parameters(body)
    check_unsupported(body)
    stream = body.boolean("stream", default=False)
    options = body.raw("stream_options")
    if options is not None and not stream:
        raise bad_field("stream_options", "only allowed when 'stream' is true")
    if options is not None and not isinstance(options, dict):
        raise bad_field("stream_options", "expected an object")
    include_usage = (options or {}).get("include_usage", False)
    if include_usage is None:
        include_usage = False
    if not isinstance(include_usage, bool):
        raise bad_field("stream_options.include_usage", f"must be true or false, got {shown(include_usage)}")
    template_kwargs = body.raw("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise bad_field("chat_template_kwargs", "expected an object")
    mm_kwargs = body.raw("mm_processor_kwargs")           # vLLM's extension, e.g. {"fps": 2}
    if mm_kwargs is not None and not isinstance(mm_kwargs, dict):
        raise bad_field("mm_processor_kwargs", "expected an object")
    model = await proxy.models.resolve("chat", model_name)
    for kind, items in media.items():
        if f"{kind}s" not in model.inputs:
            raise bad_field("messages", f"the model '{model.name}' takes no {kind}s (only text content parts)")

    values = {"messages": (messages, "BYTES"), "sampling_parameters": (sampling or None, "BYTES"),
              "stream": (stream, "BOOL"), "chat_template_kwargs": (template_kwargs, "BYTES"),
              "images": (media.get("image"), "BYTES"), "videos": (media.get("video"), "BYTES"),
              "mm_processor_kwargs": (mm_kwargs, "BYTES")}
    replies = proxy.gateway.stream(model.name, values, request.is_disconnected, param_mapper(length_field))
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model.name}
    if not stream:
        return await whole_answer(replies, meta)
    first_reply = await first_response(replies)
    return sse_response(stream_chunks(replies, first_reply, meta, include_usage))


async def whole_answer(replies, meta: dict) -> dict:
    parts, last = [], {}
    async with aclosing(replies):       # a client that leaves: ClientGone, answered 499 by the app
        async for outputs in replies:
            parts.append(text(outputs, "text_output"))
            last = outputs
    return {"id": meta["id"], "object": "chat.completion", "created": meta["created"], "model": meta["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(parts), "refusal": None},
                         "logprobs": None, "finish_reason": finish_reason(last)}],
            "usage": usage(last), "system_fingerprint": None}


def finish_reason(outputs) -> str:
    reason = text(outputs, "finish_reason")
    return reason if reason in ("stop", "length") else "stop"


async def stream_chunks(replies, first_reply, meta: dict, include_usage: bool):
    """The SSE frames. Runs inside the response: a client that leaves cancels it, and closing
    `replies` (aclosing) closes the Triton stream with cancel_requests=True."""
    head = {"id": meta["id"], "object": "chat.completion.chunk", "created": meta["created"], "model": meta["model"],
            "system_fingerprint": None}
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict, reason: str | None = None) -> bytes:
        return event({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
                      **extra})

    async def outputs_in_order():
        yield first_reply
        async for outputs in replies:
            yield outputs

    last = first_reply
    async with aclosing(replies):
        yield chunk({"role": "assistant", "content": "", "refusal": None})
        try:
            async for outputs in outputs_in_order():
                last = outputs
                piece = text(outputs, "text_output")
                if piece:
                    yield chunk({"content": piece})
        except ProxyError as e:         # after the 200: the error travels as an event
            yield event(e.body())
            yield DONE
            return
        except ClientGone:
            return
        yield chunk({}, finish_reason(last))
        if include_usage:
            yield event({**head, "choices": [], "usage": usage(last)})
        yield DONE
