"""OpenAI's chat / completions request fields -> a chat model's Triton inputs.

Sampling fields become `sampling_parameters` (vLLM's names, what the model's pre step reads):
temperature, top_p, top_k, min_p, seed, stop, penalties, logit_bias, n, logprobs (top_logprobs, or 0
for the chosen token's alone), max_tokens, thinking_budget. Structured output, `response_format`
(json_object, json_schema) or vLLM's extensions (`guided_json`, `guided_regex`, `guided_choice`,
`guided_grammar`, `structured_outputs`), becomes `sampling_parameters.guided_decoding`. Tools go as
the `tools`, `tool_choice` and `parallel_tool_calls` inputs. The model's own errors name its field
(`sampling_parameters.guided_decoding.json`); `param_mapper` names the request's instead.
"""
from __future__ import annotations

import json

from triton_omni.client.openai_proxy.errors import bad_field
from triton_omni.client.openai_proxy.fields import INT32_MAX, INT64_MAX, INT64_MIN, Fields, shown

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def sampling_parameters(body: Fields, completions: bool = False) -> tuple[dict, dict[str, str]]:
    """The model's `sampling_parameters`, and which request field set each of its fields (for errors).
    `completions`: /v1/completions' `logprobs` (an integer) instead of chat's logprobs + top_logprobs."""
    length = "max_completion_tokens" if body.has("max_completion_tokens") else "max_tokens"
    p = {"max_tokens": body.number(length, lo=1, integer=True),
         "temperature": body.number("temperature", lo=0, hi=2),
         "top_p": body.number("top_p", lo=0, hi=1, lo_open=True),
         "seed": body.number("seed", lo=INT64_MIN, hi=INT64_MAX, integer=True),
         "presence_penalty": body.number("presence_penalty", lo=-2, hi=2),
         "frequency_penalty": body.number("frequency_penalty", lo=-2, hi=2),
         "n": body.number("n", lo=1, hi=MAX_N, integer=True),
         # extensions that vLLM's OpenAI server also takes
         "top_k": body.number("top_k", lo=-1, integer=True),
         "min_p": body.number("min_p", lo=0, hi=1),
         "repetition_penalty": body.number("repetition_penalty", lo=0, hi=2, lo_open=True),
         "min_tokens": body.number("min_tokens", lo=0, integer=True),
         "thinking_budget": body.number("thinking_budget", lo=0, integer=True),
         "ignore_eos": body.boolean("ignore_eos")}
    names = {"max_tokens": length}
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
    bias = body.raw("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS or not all(
                str(k).isdigit() and type(v) in (int, float) and -100 <= v <= 100 for k, v in bias.items()):
            raise bad_field("logit_bias", f"expected at most {MAX_LOGIT_BIAS} token ids (as strings) with biases "
                                          "in [-100, 100]")
        p["logit_bias"] = {str(k): v for k, v in bias.items()}
    p["logprobs"] = logprobs(body, completions)
    guided, names["guided_decoding"] = guided_decoding(body)
    if guided is not None:
        p["guided_decoding"] = guided
    return {k: v for k, v in p.items() if v is not None}, names


def logprobs(body: Fields, completions: bool) -> int | None:
    """The number of alternatives per token the model reports (None: no logprobs)."""
    if completions:                    # an integer
        return body.number("logprobs", lo=0, hi=MAX_TOP_LOGPROBS, integer=True)
    if body.raw("logprobs") is not None and not isinstance(body.raw("logprobs"), bool):
        raise bad_field("logprobs", f"must be true or false, got {shown(body.raw('logprobs'))}")
    top = body.number("top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS, integer=True)     # chat: logprobs (bool) + top_logprobs
    if not body.boolean("logprobs", default=False):
        if top is not None:
            raise bad_field("top_logprobs", "needs 'logprobs': true")
        return None
    return top or 0


def guided_decoding(body: Fields) -> tuple[dict | None, str]:
    """Structured output as the model's guided_decoding object, and the request field that asked for it."""
    given = [f for f in ("response_format", "structured_outputs", *GUIDED) if body.raw(f) not in (None, False)]
    fmt = body.raw("response_format")
    if fmt is not None and isinstance(fmt, dict) and fmt.get("type") == "text":
        given.remove("response_format")
    if not given:
        return None, "response_format"
    if len(given) > 1:
        raise bad_field(given[1], f"give one kind of structured output, not both {given[0]} and {given[1]}")
    name = given[0]
    value = body.raw(name)
    if name in GUIDED:
        if name == "guided_json" and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise bad_field(name, "not valid JSON") from None
        return {GUIDED[name]: value}, name
    if name == "structured_outputs":
        if not isinstance(value, dict):
            raise bad_field(name, "expected an object")
        return dict(value), name
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_field("response_format", "expected {type: text | json_object | json_schema}")
    if value["type"] == "json_object":
        return {"json_object": True}, name
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
        raise bad_field("response_format.json_schema", "expected {name, schema, strict}")
    return {"json": spec.get("schema", {})}, "response_format.json_schema.schema"


def tool_inputs(body: Fields) -> dict:
    """The `tools`, `tool_choice` and `parallel_tool_calls` inputs (checked further by the model)."""
    tools = body.raw("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise bad_field("tools", "expected a list of {type: function, function: {name, parameters}}")
    choice = body.raw("tool_choice")
    if choice is not None and not isinstance(choice, (str, dict)):
        raise bad_field("tool_choice", "expected auto, none, required or {type: function, function: {name}}")
    if isinstance(choice, dict):
        choice = json.dumps(choice)
    return {"tools": (tools or None, "BYTES"), "tool_choice": (choice, "BYTES"),
            "parallel_tool_calls": (body.boolean("parallel_tool_calls"), "BOOL")}


def param_mapper(names: dict[str, str], prompt_field: str = "messages"):
    """The model's field names (sampling_parameters.top_p, prompt) -> the request's (top_p, messages)."""
    def param_of(field: str) -> str:
        if field.startswith("sampling_parameters.guided_decoding"):
            return names.get("guided_decoding", "response_format")
        if field.startswith("sampling_parameters."):
            name = field.split(".", 1)[1].split(".")[0]
            if name == "logprobs":
                return "top_logprobs" if prompt_field == "messages" else "logprobs"
            return names.get(name, name)
        if field in ("prompt", "text_input"):
            return prompt_field
        return field
    return param_of
