"""POST /v1/completions onto a `chat` model: a raw prompt (text or token ids, no chat template) in,
its continuation out (OpenAI's legacy completions; the vLLM backend's `text_input` underneath).

`prompt`: a string, a list of token ids, or a list of one of those per prompt (each its own request
to the model; streamed answers take one prompt). `echo` puts the prompt's text before its answer.
`suffix` (insertion) is refused: these models only continue. `logprobs` (an integer, at most 20):
the chosen tokens' logprobs and that many alternatives each.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing

from fastapi import APIRouter, Request

from triton_omni.client.openai_proxy.chat import stream_options
from triton_omni.client.openai_proxy.chat_fields import param_mapper, sampling_parameters
from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import ProxyError, bad_field, missing
from triton_omni.client.openai_proxy.fields import INT32_MAX, json_body
from triton_omni.client.openai_proxy.sse import DONE, event, sse_response
from triton_omni.client.openai_proxy.triton import ClientGone, first_response
from triton_omni.client.tensors import first, text

router = APIRouter()
MAX_PROMPTS = 16


def prompts(body, max_chars: int) -> list[tuple[str, object]]:
    """Each prompt as ("text_input", str) or ("prompt_token_ids", [ids])."""
    raw = body.raw("prompt")
    if raw is None:
        raise missing("prompt")
    is_ids = lambda v: isinstance(v, list) and v and all(type(t) is int and 0 <= t <= INT32_MAX for t in v)  # noqa: E731
    if isinstance(raw, str) or is_ids(raw):
        raw = [raw]
    if not isinstance(raw, list) or not raw or len(raw) > MAX_PROMPTS:
        raise bad_field("prompt", f"expected a string, a list of token ids, or a list of up to {MAX_PROMPTS} of them")
    out = []
    for i, p in enumerate(raw):
        if isinstance(p, str) and p:
            if len(p) > max_chars:
                raise bad_field(f"prompt[{i}]", f"has more than {max_chars} characters")
            out.append(("text_input", p))
        elif is_ids(p):
            out.append(("prompt_token_ids", p))
        else:
            raise bad_field(f"prompt[{i}]" if len(raw) > 1 else "prompt",
                            f"expected a non-empty string or a list of token ids in [0, {INT32_MAX}]")
    return out


@router.post("/v1/completions")
async def completions(request: Request):
    proxy = proxy_of(request)
    body = await json_body(request)
    model_name = body.string("model", required=True)
    items = prompts(body, proxy.settings.max_text_chars)
    if body.raw("suffix") not in (None, ""):
        raise bad_field("suffix", "not supported: these models continue a prompt, they do not fill in between")
    for name in ("best_of",):
        if body.raw(name) not in (None, 1):
            raise bad_field(name, "not supported by this server")
    sampling, names = sampling_parameters(body, completions=True)
    echo = body.boolean("echo", default=False)
    if echo and sampling.get("logprobs") is not None:
        raise bad_field("echo", "cannot be combined with logprobs here (the prompt's logprobs are not computed)")
    stream = body.boolean("stream", default=False)
    include_usage = stream_options(body, stream)
    if stream and len(items) > 1:
        raise bad_field("prompt", "a streamed completion takes one prompt")
    model = await proxy.models.resolve("chat", model_name)
    n = sampling.get("n", 1)

    def replies_of(kind, prompt):
        values = {kind: (prompt, "BYTES" if kind == "text_input" else "INT32"),
                  "sampling_parameters": (sampling or None, "BYTES"), "stream": (stream, "BOOL"),
                  "exclude_input_in_output": (not echo, "BOOL")}
        return proxy.gateway.stream(model.name, values, request.is_disconnected, param_mapper(names, "prompt"),
                                    batched=model.batched)

    meta = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model.name}
    if stream:
        replies = replies_of(*items[0])
        first_reply = await first_response(replies)
        return sse_response(stream_events(replies, first_reply, meta, include_usage, n))
    answers = await asyncio.gather(*(collect(replies_of(*item), n) for item in items))
    choices = [{"index": p * n + c["index"], **{k: v for k, v in c.items() if k != "index"}}
               for p, answer in enumerate(answers) for c in answer[0]]
    prompt_tokens = sum(a[1] for a in answers)
    completion = sum(a[2] for a in answers)
    return {"id": meta["id"], "object": "text_completion", "created": meta["created"], "model": meta["model"],
            "choices": choices, "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion,
                      "prompt_tokens_details": {"cached_tokens": sum(a[3] for a in answers)}}}


def _logprobs(entries: list[dict], offset: int) -> dict:
    """OpenAI's per-token objects -> the legacy completions shape."""
    tokens, offsets, at = [], [], offset
    for e in entries:
        tokens.append(e["token"])
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}


async def collect(replies, n: int):
    """(choices, prompt tokens, completion tokens, cached tokens) of one prompt's answer."""
    parts = [[] for _ in range(n)]
    lps = [[] for _ in range(n)]
    reasons, usage = [None] * n, [{} for _ in range(n)]
    async with aclosing(replies):
        async for outputs in replies:
            i = int(first(outputs, "index", 0)) % n
            parts[i].append(text(outputs, "text_output"))
            if text(outputs, "logprobs"):
                lps[i] += json.loads(text(outputs, "logprobs"))
            reasons[i] = text(outputs, "finish_reason") or reasons[i]
            usage[i] = {k: int(first(outputs, k, 0)) for k in ("prompt_tokens", "completion_tokens", "cached_tokens")}
    choices = [{"index": i, "text": "".join(parts[i]), "logprobs": _logprobs(lps[i], 0) if lps[i] else None,
                "finish_reason": reasons[i] if reasons[i] in ("stop", "length") else "stop"} for i in range(n)]
    return (choices, usage[0].get("prompt_tokens", 0), sum(u.get("completion_tokens", 0) for u in usage),
            usage[0].get("cached_tokens", 0))


async def stream_events(replies, first_reply, meta: dict, include_usage: bool, n: int):
    head = {"id": meta["id"], "object": "text_completion", "created": meta["created"], "model": meta["model"],
            "system_fingerprint": None}
    usage = [{} for _ in range(n)]
    offsets = [0] * n

    async def outputs_in_order():
        yield first_reply
        async for outputs in replies:
            yield outputs

    async with aclosing(replies):
        try:
            async for outputs in outputs_in_order():
                i = int(first(outputs, "index", 0)) % n
                piece, reason = text(outputs, "text_output"), text(outputs, "finish_reason")
                lps = json.loads(text(outputs, "logprobs")) if text(outputs, "logprobs") else []
                usage[i] = {k: int(first(outputs, k, 0)) for k in ("prompt_tokens", "completion_tokens", "cached_tokens")}
                if piece or reason or lps:
                    yield event({**head, "choices": [{
                        "index": i, "text": piece, "logprobs": _logprobs(lps, offsets[i]) if lps else None,
                        "finish_reason": (reason if reason in ("stop", "length") else "stop") if reason else None}],
                        **({"usage": None} if include_usage else {})})
                offsets[i] += len(piece)
        except ProxyError as e:
            yield event(e.body())
            yield DONE
            return
        except ClientGone:
            return
        if include_usage:
            prompt = usage[0].get("prompt_tokens", 0)
            completion = sum(u.get("completion_tokens", 0) for u in usage)
            yield event({**head, "choices": [], "usage": {
                "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": usage[0].get("cached_tokens", 0)}}})
        yield DONE
