"""The chat models as users call them, live: the `openai` SDK through the proxy, Triton's vLLM-backend
clients, and the answers checked against transformers on the same tiny checkpoint.

One tritonserver (qwen3_chat, whose tiny tokenizer has Qwen's reasoning and tool-call markers and a
Qwen-style template) and one proxy serve the whole module: tool calls (streamed and not), structured
output at temperature 1.0 (the grammar mask alone makes random weights write valid JSON), logprobs
and penalties against references, n > 1 with a seed, reasoning split by a reasoning budget, prefix
caching's cached_tokens, /v1/completions, bad input naming the field.
"""
from __future__ import annotations

import asyncio
import json

import jsonschema
import numpy as np
import openai
import pytest
import torch

from tests.conftest import running_server
from tests.test_openai_proxy import running_proxy

pytestmark = pytest.mark.server

KEY = "sk-chat-api"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["zone"]}}}
# bounded pieces only (enums, patterns, integer ranges): at temperature 1.0 a random model would write
# an unbounded string until max_tokens
SCHEMA = {"type": "object", "properties": {
    "color": {"type": "string", "enum": ["red", "green", "blue"]},
    "size": {"type": "integer", "minimum": 0, "maximum": 99},
    "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,5}$"}, "maxItems": 3}},
    "required": ["color", "size", "ok", "tags"], "additionalProperties": False}
USER = [{"role": "user", "content": "Write a haiku about the sea."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("chat_api"), ["qwen3_chat"], ["qwen3_chat.ar.max_num_seqs=8"]) as s:
        yield s


@pytest.fixture(scope="module")
def sdk(server, tmp_path_factory):
    log = tmp_path_factory.mktemp("chat_api_proxy") / "proxy.log"
    with running_proxy(server.grpc_url, log, "--api-key", KEY) as url:
        client = openai.OpenAI(api_key=KEY, base_url=f"{url}/v1", max_retries=0, timeout=120)
        yield client
        client.close()


@pytest.fixture(scope="module")
def ref(tiny_checkpoints):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_checkpoints["qwen3"]
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def prompt_ids(tokenizer, messages, **kwargs) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_tool_calls_non_streamed_and_streamed_then_their_results(sdk):
    r = sdk.chat.completions.create(model="qwen3_chat", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                    tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                    temperature=1.0, seed=3, max_tokens=80)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])

    stream = sdk.chat.completions.create(model="qwen3_chat", messages=[{"role": "user", "content": "Time?"}],
                                         tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
                                         temperature=1.0, seed=4, max_tokens=80, stream=True)
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
    assert len(calls) == 1 and deltas[-1].finish_reason == "tool_calls"
    name = calls[0].function.name
    args = json.loads(calls[0].function.arguments)
    jsonschema.validate(args, {"get_weather": WEATHER, "get_time": TIME}[name]["function"]["parameters"])
    assert not any(d.delta.content for d in deltas), "a required tool call leaves no content"

    # the call and its result in the history, rendered by the chat template
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'}]
    r2 = sdk.chat.completions.create(model="qwen3_chat", messages=history, tools=[WEATHER, TIME], max_tokens=4,
                                     temperature=0)
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens and r2.choices[0].message.content


def test_json_schema_answers_validate_at_temperature_one(sdk):
    r = sdk.chat.completions.create(model="qwen3_chat", messages=USER, temperature=1.0, seed=11, n=3, max_tokens=120,
                                    response_format={"type": "json_schema",
                                                     "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}})
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
    assert len({c.message.content for c in r.choices}) > 1, "three samples, one answer"
    regex = sdk.chat.completions.create(model="qwen3_chat", messages=USER, temperature=1.0, seed=2, max_tokens=20,
                                        extra_body={"guided_regex": "[0-9]{3}-[a-c]{2}"})
    assert __import__("re").fullmatch("[0-9]{3}-[a-c]{2}", regex.choices[0].message.content)
    choice = sdk.chat.completions.create(model="qwen3_chat", messages=USER, temperature=1.0, seed=5, max_tokens=20,
                                         extra_body={"guided_choice": ["alpha", "beta"]})
    assert choice.choices[0].message.content in ("alpha", "beta")


def test_logprobs_equal_log_softmax_of_the_reference_logits(sdk, ref):
    model, tok = ref
    r = sdk.chat.completions.create(model="qwen3_chat", messages=USER, temperature=0, max_tokens=8, logprobs=True,
                                    top_logprobs=3, extra_body={"ignore_eos": True})
    entries = r.choices[0].logprobs.content
    assert len(entries) == 8 and all(len(e.top_logprobs) == 3 for e in entries)
    ids = prompt_ids(tok, USER)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                             pad_token_id=None, output_logits=True, return_dict_in_generate=True)
    for i, e in enumerate(entries):
        lp = out.logits[i][0].float().log_softmax(-1)
        chosen = int(out.sequences[0, len(ids) + i])
        assert abs(e.logprob - float(lp[chosen])) < 1e-4
        top = lp.topk(3)
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert e.token == tok.convert_tokens_to_string([tok.convert_ids_to_tokens(chosen)])


def test_penalties_equal_transformers_logits_processors(sdk, ref):
    """Greedy with repetition (transformers' RepetitionPenaltyLogitsProcessor), frequency and presence
    (OpenAI's formula over the generated tokens), logit_bias (SequenceBiasLogitsProcessor), min_p."""
    from transformers import RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor

    model, tok = ref
    ids = prompt_ids(tok, USER)
    bias = {"65": 3.0, "70": -5.0}
    r = sdk.chat.completions.create(model="qwen3_chat", messages=USER, temperature=0, max_tokens=16,
                                    presence_penalty=0.5, frequency_penalty=0.7, logit_bias=bias,
                                    extra_body={"repetition_penalty": 1.3, "ignore_eos": True})
    rep = RepetitionPenaltyLogitsProcessor(1.3)
    seq_bias = SequenceBiasLogitsProcessor({(int(k),): v for k, v in bias.items()})
    seq = list(ids)
    with torch.no_grad():
        for _ in range(16):
            scores = model(torch.tensor([seq])).logits[:, -1].float()
            scores = rep(torch.tensor([seq]), scores)
            generated = seq[len(ids):]
            for t in set(generated):
                scores[0, t] -= 0.7 * generated.count(t) + 0.5
            scores = seq_bias(torch.tensor([seq]), scores)
            seq.append(int(scores.argmax(-1)))
    assert r.choices[0].message.content == tok.decode(seq[len(ids):], skip_special_tokens=True)
    plain = sdk.chat.completions.create(model="qwen3_chat", messages=USER, temperature=0, max_tokens=16,
                                        extra_body={"ignore_eos": True})
    assert plain.choices[0].message.content != r.choices[0].message.content


def test_n_samples_with_a_seed_are_reproducible_and_differ(sdk):
    def ask():
        r = sdk.chat.completions.create(model="qwen3_chat", messages=USER, temperature=1.0, seed=42, n=3, max_tokens=12,
                                        extra_body={"ignore_eos": True})
        assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.completion_tokens == 36
        return [c.message.content for c in r.choices]

    a = ask()
    assert ask() == a and len(set(a)) == 3
    chunks = list(sdk.chat.completions.create(model="qwen3_chat", messages=USER, temperature=1.0, seed=42, n=3,
                                              max_tokens=12, stream=True, extra_body={"ignore_eos": True}))
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in range(3)]
    assert texts == a


def test_reasoning_content_split_by_a_reasoning_budget(sdk):
    """The template opens the answer's reasoning (enable_thinking); after 6 reasoning tokens the budget
    forces its end, and the rest is content."""
    kw = dict(model="qwen3_chat", messages=USER, temperature=0, max_tokens=20,
              extra_body={"chat_template_kwargs": {"enable_thinking": True}, "thinking_budget": 6, "ignore_eos": True})
    r = sdk.chat.completions.create(**kw)
    msg = r.choices[0].message.model_dump()
    assert msg["reasoning_content"] and msg["content"]
    assert "<think>" not in msg["content"] + msg["reasoning_content"] and "</think>" not in msg["content"]
    assert r.usage.completion_tokens_details.reasoning_tokens == 6
    chunks = list(sdk.chat.completions.create(stream=True, **kw))
    thought = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (thought, said) == (msg["reasoning_content"], msg["content"])
    off = sdk.chat.completions.create(model="qwen3_chat", messages=USER, temperature=0, max_tokens=8)
    assert not off.choices[0].message.model_dump().get("reasoning_content")


def test_repeated_prompt_hits_the_prefix_cache_with_the_same_answer(sdk):
    long = [{"role": "system", "content": "You are a careful assistant. " * 12}] + USER
    a = sdk.chat.completions.create(model="qwen3_chat", messages=long, temperature=0, max_tokens=10)
    b = sdk.chat.completions.create(model="qwen3_chat", messages=long, temperature=0, max_tokens=10)
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.usage.prompt_tokens_details.cached_tokens >= 16 * ((a.usage.prompt_tokens - 1) // 16) - 16 > 0


def test_completions_prompt_text_ids_echo(sdk, ref):
    _, tok = ref
    r = sdk.completions.create(model="qwen3_chat", prompt="The quick brown fox", max_tokens=6, temperature=0,
                               logprobs=2, extra_body={"ignore_eos": True})
    text = r.choices[0].text
    assert r.object == "text_completion" and r.usage.completion_tokens == 6 and text
    assert len(r.choices[0].logprobs.tokens) == 6
    ids = tok("The quick brown fox", add_special_tokens=False)["input_ids"]
    by_ids = sdk.completions.create(model="qwen3_chat", prompt=ids, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert by_ids.choices[0].text == text
    echo = sdk.completions.create(model="qwen3_chat", prompt="The quick brown fox", max_tokens=6, temperature=0,
                                  echo=True, extra_body={"ignore_eos": True})
    assert echo.choices[0].text == "The quick brown fox" + text
    with pytest.raises(openai.BadRequestError) as e:
        sdk.completions.create(model="qwen3_chat", prompt="x", suffix="y", max_tokens=2)
    assert e.value.body["param"] == "suffix"


BAD = [
    ("a schema that is not JSON Schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}}, "response_format.json_schema.schema"),
    ("an unsatisfiable regex", {"extra_body": {"guided_regex": "a{3,1}"}}, "guided_regex"),
    ("tool_choice naming an unknown function", {"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "launch_rocket"}}}, "tool_choice"),
    ("n too large", {"n": 17}, "n"),
    ("top_logprobs above 20", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
]


@pytest.mark.parametrize("case,fields,param", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_name_the_field(sdk, case, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model="qwen3_chat", messages=USER, max_tokens=4, **fields)
    assert e.value.body["param"] == param, e.value.body
    assert e.value.body["code"] == "invalid_value"


def vllm_backend_request(prompt: str, stream: bool, request_id: int, exclude_input_in_output: bool) -> dict:
    """Built exactly as triton-inference-server/vllm_backend's samples/client.py builds its requests."""
    import tritonclient.grpc.aio as grpcclient

    sampling_parameters = {"temperature": "0.1", "top_p": "0.95", "max_tokens": "100"}
    inputs = []
    prompt_data = np.array([prompt.encode("utf-8")], dtype=np.object_)
    inputs.append(grpcclient.InferInput("text_input", [1], "BYTES"))
    inputs[-1].set_data_from_numpy(prompt_data)
    inputs.append(grpcclient.InferInput("stream", [1], "BOOL"))
    inputs[-1].set_data_from_numpy(np.array([stream], dtype=bool))
    inputs.append(grpcclient.InferInput("sampling_parameters", [1], "BYTES"))
    inputs[-1].set_data_from_numpy(np.array([json.dumps(sampling_parameters).encode("utf-8")], dtype=np.object_))
    inputs.append(grpcclient.InferInput("exclude_input_in_output", [1], "BOOL"))
    inputs[-1].set_data_from_numpy(np.array([exclude_input_in_output], dtype=bool))
    outputs = [grpcclient.InferRequestedOutput("text_output")]
    return {"model_name": "qwen3_chat", "inputs": inputs, "outputs": outputs, "request_id": str(request_id),
            "parameters": sampling_parameters}


def test_triton_vllm_backend_sample_client_requests(server):
    import tritonclient.grpc.aio as grpcclient

    prompts = ["Hello, my name is", "The capital of France is"]

    async def run(stream: bool, exclude: bool) -> dict[str, str]:
        async def requests():
            for i, p in enumerate(prompts):
                yield vllm_backend_request(p, stream, i, exclude)
        client = grpcclient.InferenceServerClient(url=server.grpc_url)
        results: dict[str, list[bytes]] = {str(i): [] for i in range(len(prompts))}
        try:
            async for result, error in client.stream_infer(inputs_iterator=requests(), stream_timeout=120):
                assert error is None, error
                for piece in result.as_numpy("text_output"):
                    results[result.get_response().id].append(piece)
        finally:
            await client.close()
        return {k: b"".join(v).decode() for k, v in results.items()}

    streamed = asyncio.run(run(True, True))
    whole = asyncio.run(run(False, False))      # the sample's default: the prompt comes back first
    for i, p in enumerate(prompts):
        assert streamed[str(i)] and whole[str(i)].startswith(p)
