"""The chat ensembles on a live tritonserver: streaming, batching, cancellation, bad input.

Expected texts come from the reference implementation (transformers `generate`, greedy) on the
same tiny checkpoint, so the served path is checked end to end, not only for self-consistency.
"""
from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_omni.client.chat import ChatClient
from triton_omni.client.tensors import make_inputs
from triton_omni.client.triton import is_final_response
from tests.conftest import rounds_until_batched, running_server

pytestmark = pytest.mark.server

PROMPTS = ["Write a haiku about the sea.", "Tell me a story about a robot.", "café 中文 🙂 emoji?",
           "def main():", "The quick brown fox", "Numbers 0123", "Unicode: naïve résumé", "pack my box"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("chat"), ["qwen3_chat", "qwen3_5_chat"],
                        ["qwen3_chat.ar.max_num_seqs=8", "qwen3_5_chat.ar.max_num_seqs=4"]) as s:
        yield s


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    """Greedy continuation by transformers for (model, prompt) -> (text, token count)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache: dict = {}

    def run(name: str, prompt: str, max_tokens: int) -> tuple[str, int]:
        folder = tiny_checkpoints[name]
        if name not in cache:
            cache[name] = (AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).eval())
        tok, model = cache[name]
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
        return tok.decode(out, skip_special_tokens=True), len(out)

    return run


def chat(server, model: str, prompt: str, **sampling):
    client = ChatClient(server.grpc_url, timeout_s=60)
    stream = sampling.pop("stream", True)
    chunks = list(client.stream(model, messages=[{"role": "user", "content": prompt}], sampling=sampling,
                                stream=stream))
    return "".join(c.text for c in chunks), chunks


def metric(server, name: str, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    m = re.search(rf'^{name}{{model="{model}"}} ([0-9.e+]+)$', text, re.M)
    assert m, f"{name} for {model} not in /metrics"
    return float(m.group(1))


GREEDY = {"max_tokens": 24, "temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("model,ckpt", [("qwen3_chat", "qwen3"), ("qwen3_5_chat", "qwen3_5")])
def test_streamed_greedy_text_equals_transformers(server, reference, model, ckpt):
    text, chunks = chat(server, model, PROMPTS[0], **GREEDY)
    want, n = reference(ckpt, PROMPTS[0], 24)
    assert text == want
    assert len(chunks) > 1, "expected the answer in several streamed chunks"
    assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == n == 24
    assert all(c.finish_reason is None for c in chunks[:-1])


def test_non_streamed_equals_streamed(server):
    streamed, _ = chat(server, "qwen3_chat", PROMPTS[2], **GREEDY)
    whole, chunks = chat(server, "qwen3_chat", PROMPTS[2], stream=False, **GREEDY)
    assert len(chunks) == 1 and whole == streamed


def test_concurrent_streams_equal_sequential_and_batch(server):
    one_by_one = [chat(server, "qwen3_chat", p, **GREEDY)[0] for p in PROMPTS]
    time.sleep(0.3)    # metrics are published every 0.1 s
    steps0 = metric(server, "triton_omni_ar_decode_steps", "qwen3_chat_ar")
    tokens0 = metric(server, "triton_omni_ar_decode_tokens", "qwen3_chat_ar")

    def together() -> list[str]:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            return list(pool.map(lambda p: chat(server, "qwen3_chat", p, **GREEDY)[0], PROMPTS))

    # Triton's dynamic batcher also grouped the detokenizer's requests (statistics API)
    rounds = rounds_until_batched(server, "qwen3_chat_post", together)
    assert rounds[-1][2] < rounds[-1][1], f"post ran (requests, executions) {rounds[-1][1:]}"
    assert all(texts == one_by_one for texts, _, _ in rounds)
    time.sleep(0.3)    # metrics are published every 0.1 s
    steps = metric(server, "triton_omni_ar_decode_steps", "qwen3_chat_ar") - steps0
    tokens = metric(server, "triton_omni_ar_decode_tokens", "qwen3_chat_ar") - tokens0
    assert tokens == 8 * 23 * len(rounds), "every decoded token is counted once"
    assert tokens / steps >= 2.0, f"decode steps were not shared: {tokens} tokens in {steps} steps"


def test_stop_string_cuts_text(server):
    full, _ = chat(server, "qwen3_chat", PROMPTS[1], **GREEDY)
    # from the answer's middle (random weights: skip U+FFFD, which stands for bytes, not text)
    start = next(i for i in range(6, len(full) - 3) if "\ufffd" not in full[i:i + 3])
    stop = full[start:start + 3]
    text, chunks = chat(server, "qwen3_chat", PROMPTS[1], stop=[stop], **GREEDY)
    assert text == full[:full.find(stop)]
    assert chunks[-1].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(server):
    params = {"max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "top_k": 50}
    a, _ = chat(server, "qwen3_chat", PROMPTS[3], seed=11, **params)
    b, _ = chat(server, "qwen3_chat", PROMPTS[3], seed=11, **params)
    c, _ = chat(server, "qwen3_chat", PROMPTS[3], seed=12, **params)
    assert a == b and a != c


def test_cancelled_streams_free_their_slots(server):
    """8 endless streams fill every slot; once cancelled, decoding stops and a new request runs."""
    client = ChatClient(server.grpc_url, timeout_s=60)
    long = {"max_tokens": 1800, "ignore_eos": True}
    streams = [client.stream("qwen3_chat", messages=[{"role": "user", "content": p}], sampling=long) for p in PROMPTS]
    for s in streams:
        next(s)                      # every one is running
    for s in streams:
        s.close()                    # closes the gRPC stream with cancel_requests=True
    deadline = time.monotonic() + 5
    while True:
        a = metric(server, "triton_omni_ar_decode_steps", "qwen3_chat_ar")
        time.sleep(0.5)
        if metric(server, "triton_omni_ar_decode_steps", "qwen3_chat_ar") == a:
            break
        assert time.monotonic() < deadline, "decoding went on after every stream was cancelled"
    start = time.monotonic()
    # ignore_eos: with sampling, the tiny model's EOS (2 of 512 tokens) may come before the 4th token
    text, chunks = chat(server, "qwen3_chat", PROMPTS[0], max_tokens=4, ignore_eos=True)
    assert chunks[-1].completion_tokens == 4 and time.monotonic() - start < 5


def test_new_requests_start_right_after_a_mass_cancel(server):
    """Cancel every slot's stream and send new requests at once, three times: they start within
    seconds. (A front that held its stub lock while starting a request waited, lock held, for the
    request's first token, which waited for a slot, which only the front's cancellation checks,
    also under that lock, could free: new requests then waited until the cancelled streams had
    run to max_tokens, ~15 s here, in about one round of three.)"""
    client = ChatClient(server.grpc_url, timeout_s=60)
    long = {"max_tokens": 1800, "ignore_eos": True}
    for _ in range(3):
        streams = [client.stream("qwen3_chat", messages=[{"role": "user", "content": p}], sampling=long)
                   for p in PROMPTS]
        for s in streams:
            next(s)
        for s in streams:
            s.close()
        waits: list[float] = []

        def one(prompt):
            start = time.monotonic()
            _, chunks = chat(server, "qwen3_chat", prompt, max_tokens=2, ignore_eos=True)
            assert chunks[-1].completion_tokens == 2
            waits.append(time.monotonic() - start)

        threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS[:2]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(waits) == 2 and max(waits) < 6, waits


FRONTS = ("qwen3_chat", "qwen3_5_chat")      # unbatched (inputs of shape [1]), as the vLLM backend's models


def _grpc_inputs(values: dict, batched: bool = True) -> list:
    """name -> (value, dtype); a numpy array is sent as it is (its batch dimension included, if batched)."""
    inputs = []
    for name, (value, dtype) in values.items():
        if isinstance(value, np.ndarray):
            value = value if batched else value[0]
            t = grpcclient.InferInput(name, list(value.shape), dtype)
            t.set_data_from_numpy(value)
            inputs.append(t)
        else:
            inputs += make_inputs(grpcclient, {name: (value, dtype)}, batched)
    return inputs


def _stream(server, model: str, values: dict, wanted: list[str] | None = None) -> list:
    """One request on a gRPC stream (asking only for `wanted`, if given): each response's outputs
    by name, until the final one or the error that ends the stream."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: list = []
    done = threading.Event()

    def callback(result, error):
        if error is not None:
            got.append(error)
            done.set()
            return
        response = result.get_response()
        got.append({o.name: result.as_numpy(o.name) for o in response.outputs})
        if is_final_response(response):
            done.set()

    client.start_stream(callback=callback)
    try:
        outputs = [grpcclient.InferRequestedOutput(n) for n in wanted] if wanted else None
        client.async_stream_infer(model, _grpc_inputs(values, model not in FRONTS), outputs=outputs,
                                  enable_empty_final_response=True)
        assert done.wait(30), "the stream did not end"
    finally:
        client.stop_stream()
        client.close()
    return got


def test_streams_return_only_the_requested_outputs(server):
    """A client asking for some outputs gets those (the steps leave the others out themselves: the
    stub would drop them inside a send, without the GIL), from the front and from the AR step."""
    sampling = json.dumps({"max_tokens": 6, "temperature": 0, "ignore_eos": True})
    values = {"messages": (_msgs(PROMPTS[0]), "BYTES"), "stream": (True, "BOOL"),
              "sampling_parameters": (sampling, "BYTES")}
    responses = [r for r in _stream(server, "qwen3_chat", values, ["text_output", "finish_reason"]) if r]
    assert responses and all(set(r) == {"text_output", "finish_reason"} for r in responses), responses
    text = "".join(r["text_output"].reshape(-1)[0].decode() for r in responses)
    assert text == chat(server, "qwen3_chat", PROMPTS[0], max_tokens=6, temperature=0, ignore_eos=True)[0]
    assert responses[-1]["finish_reason"].reshape(-1)[0] == b"length"

    values = {"input_ids": (np.arange(5, 25, dtype=np.int32)[None], "INT32"), "sampling": (sampling, "BYTES"),
              "stream": (True, "BOOL")}
    responses = [r for r in _stream(server, "qwen3_chat_ar", values, ["token_ids", "finish_reason"]) if r]
    assert responses and all(set(r) == {"token_ids", "finish_reason"} for r in responses), responses
    assert responses[-1]["finish_reason"].reshape(-1)[0] == b"length"


def _stream_error(server, values: dict) -> str:
    """Send one request to qwen3_chat on a gRPC stream; return the error message it gets."""
    got = _stream(server, "qwen3_chat", values)
    assert isinstance(got[-1], InferenceServerException), "a bad request was accepted"
    return got[-1].message()


def _msgs(text="hi"):
    return [{"role": "user", "content": text}]


BAD = [
    ("empty messages", {"messages": ([], "BYTES")}, "field 'messages'"),
    ("no prompt at all", {"sampling_parameters": ({"max_tokens": 3}, "BYTES")}, "field 'messages'"),
    ("messages not JSON", {"messages": ("[{oops", "BYTES")}, "field 'messages': not valid JSON"),
    ("bad role", {"messages": ([{"role": "wizard", "content": "x"}], "BYTES")}, "field 'messages[0].role'"),
    ("max_tokens 0", {"messages": (_msgs(), "BYTES"), "sampling_parameters": ({"max_tokens": 0}, "BYTES")},
     "field 'sampling_parameters.max_tokens': must be > 0"),
    ("max_tokens above context", {"messages": (_msgs(), "BYTES"), "sampling_parameters": ({"max_tokens": 5000}, "BYTES")},
     "field 'sampling_parameters.max_tokens': 5000 does not fit"),
    ("prompt above context", {"text_input": ("word " * 3000, "BYTES")}, "field 'prompt'"),
    ("unknown sampling key", {"messages": (_msgs(), "BYTES"), "sampling_parameters": ({"temperture": 1}, "BYTES")},
     "field 'sampling_parameters': unknown key 'temperture'"),
    ("wrong sampling type", {"messages": (_msgs(), "BYTES"), "sampling_parameters": ({"temperature": "hot"}, "BYTES")},
     "field 'sampling_parameters.temperature'"),
    ("non-UTF-8 bytes", {"text_input": (np.array([[b"\xff\xfe bad"]], dtype=np.object_), "BYTES")},
     "field 'text_input': not valid UTF-8"),
    ("wrong dtype", {"messages": (np.array([[1]], dtype=np.int32), "INT32")}, "messages"),
    ("wrong shape", {"messages": (np.array([[b"a", b"b"]], dtype=np.object_), "BYTES")}, "messages"),
]


@pytest.mark.parametrize("case,values,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_input_fails_that_request_only(server, case, values, expect):
    with ThreadPoolExecutor(2) as pool:
        good = pool.submit(chat, server, "qwen3_chat", PROMPTS[0], **GREEDY)
        message = _stream_error(server, values)
        text, chunks = good.result(timeout=60)
    assert expect in message, message
    assert chunks[-1].completion_tokens == 24    # the neighbour was not harmed


def test_error_codes_over_http(server):
    """A step's InvalidInput is INVALID_ARG: HTTP 400 naming the field."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer("qwen3_chat_pre", make_inputs(httpclient, {"messages": ([], "BYTES")}))
        assert err.value.status() == "400" and "field 'messages'" in err.value.message()
    finally:
        client.close()


def test_http_generate_stream(server):
    body = json.dumps({"text_input": "The quick brown fox", "stream": True,
                       "sampling_parameters": json.dumps(GREEDY)}).encode()
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/qwen3_chat/generate_stream", data=body,
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=60) as resp:
        for line in resp:
            if line.startswith(b"data:"):
                events.append(json.loads(line[5:]))
    assert len(events) > 1
    assert all("error" not in e for e in events), events
    text = "".join(e["text_output"] for e in events)
    over_grpc = ChatClient(server.grpc_url).stream("qwen3_chat", prompt="The quick brown fox", sampling=GREEDY)
    assert text == "".join(c.text for c in over_grpc)
    assert events[-1]["finish_reason"] == "length" and events[-1]["completion_tokens"] == 24
