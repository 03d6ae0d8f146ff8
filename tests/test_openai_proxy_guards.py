"""The proxy's guard rails, against its app in-process over a fake gateway (no Triton): API keys
from a file and the environment (401), body and upload limits (413), a rate per key (429 with
Retry-After), CORS (off unless configured), 500s without tracebacks, a deadline on every Triton
call; and the request parsers refusing, before any work and naming the field, what no model should
see: 1.5 for an integer, 1e308, huge integers, NaN / Infinity, booleans for numbers, a 20 MB prompt.

The parsers are tried with a hand-written corpus and a seeded random mutation of a valid chat body
(hypothesis is not in the environment).
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import threading
import time
from types import SimpleNamespace

import numpy as np
import openai
import pytest

from triton_omni.client.openai_proxy.__main__ import main, parser, settings_of
from triton_omni.client.openai_proxy.context import Settings
from triton_omni.client.openai_proxy.errors import ProxyError, from_triton
from triton_omni.client.openai_proxy.fields import INT32_MAX, Fields, parse_json
from triton_omni.client.openai_proxy.guards import KeyRing, RateLimiter, read_api_keys
from tests.test_openai_proxy import FakeGateway, app_over, fake_gateway, request_with_headers, serving

CHAT = "/v1/chat/completions"
CHAT_OK = {"model": "fake_chat", "messages": [{"role": "user", "content": "hi"}]}
SPEECH_OK = {"model": "fake_tts", "input": "hi", "voice": "tara", "response_format": "wav"}
IMAGE_OK = {"model": "fake_image", "prompt": "a fox"}
VIDEO_OK = {"model": "fake_video", "prompt": "waves"}


def refused(fn) -> ProxyError:
    with pytest.raises(ProxyError) as e:
        fn()
    return e.value


def call(url: str, path: str, body=None, key: str | None = None, **kw):
    """(status, JSON body, headers); `body` a dict or raw JSON text."""
    data = body.encode() if isinstance(body, str) else body
    return request_with_headers(url, path, data, key=key, **kw)


@pytest.fixture(scope="module")
def open_proxy():
    """The proxy with default settings (open, no rate limit) over the fake gateway: (url, gateway)."""
    gateway = fake_gateway()
    with serving(app_over(Settings(), gateway)) as url:
        yield url, gateway


# -- the parsers: shape of a whole body, then each field ------------------------------------------
SHAPE_BAD = [
    ("NaN", '{"max_tokens": NaN}', "max_tokens", "NaN is not a number JSON allows"),
    ("Infinity", '{"temperature": Infinity}', "temperature", "Infinity is not"),
    ("nested -Infinity", '{"chat_template_kwargs": {"b": [1, -Infinity]}}', "chat_template_kwargs.b[1]",
     "-Infinity is not"),
    ("1e999 reads as inf", '{"max_tokens": 1e999}', "max_tokens", "Infinity is not"),
    ("40-digit integer", '{"seed": ' + "9" * 40 + "}", "seed", "an integer of 40 digits> is out of range"),
    ("long text", '{"messages": [{"role": "user", "content": "' + "x" * 101 + '"}]}', "messages[0].content",
     "has 101 characters; at most 100"),
    ("long key", '{"chat_template_kwargs": {"' + "k" * 101 + '": 1}}', "chat_template_kwargs", "a key of 101"),
    ("long list", '{"stop_token_ids": [' + ",".join(["1"] * 4097) + "]}", "stop_token_ids", "4097 entries"),
    ("deep", '{"k": ' + "[" * 40 + "]" * 40 + "}", "k" + "[0]" * 31, "nested deeper than 32"),
]


@pytest.mark.parametrize("raw,param,words", [c[1:] for c in SHAPE_BAD], ids=[c[0] for c in SHAPE_BAD])
def test_body_shape_is_refused_at_parse_naming_the_path(raw, param, words):
    e = refused(lambda: parse_json(raw.encode(), max_text_chars=100))
    assert (e.status, e.param, e.code) == (400, param, "invalid_value")
    assert words in e.message, e.message


def test_unparsable_bodies_are_invalid_json():
    for raw in (b"[" * 100_000 + b"]" * 100_000, b"[1, 2]", b"{not json", b'{"a": 1.5e}'):
        e = refused(lambda: parse_json(raw, max_text_chars=100))
        assert (e.status, e.code) == (400, "invalid_json")
    e = refused(lambda: parse_json(b'{"a": 1' + b"9" * 5000 + b"}", max_text_chars=100))   # never converted
    assert (e.status, e.param, e.message) == (400, "a", "'a': <an integer of 5001 digits> is out of range")
    assert parse_json(b'{"a": [1, 2.5, "x"]}', 100).data == {"a": [1, 2.5, "x"]}


ABSURD = [1e308, -1e308, 2**63, -(2**63) - 1, True, False, "7", [7], {"v": 7}, None, float("nan"), float("inf")]


@pytest.mark.parametrize("value", [*ABSURD, 1.5, 0, -1, INT32_MAX + 1], ids=repr)
def test_an_integer_field_refuses_what_is_no_integer_in_range(value):
    fields = Fields({"max_tokens": value})
    if value is None:
        assert fields.number("max_tokens", lo=1, integer=True) is None      # absent: the default
        return
    e = refused(lambda: fields.number("max_tokens", lo=1, integer=True))
    assert (e.status, e.param, e.code) == (400, "max_tokens", "invalid_value")
    assert "an integer in [1, 2147483647]" in e.message


def test_number_errors_say_what_is_wrong():
    def message(value, form=False, **kw):
        return refused(lambda: Fields({"f": value}, form=form).number("f", **kw)).message

    assert message(1.5, lo=1, integer=True) == "'f': 1.5 is not an integer; expected an integer in [1, 2147483647]"
    assert message(1e308, lo=1, integer=True) == "'f': 1e+308 is out of range; expected an integer in [1, 2147483647]"
    assert message(True, lo=0, hi=2) == "'f': expected a number in [0, 2], got true"
    assert message(1e39) == "'f': 1e+39 is out of range; expected a number in [-3.40282e+38, 3.40282e+38]"
    assert message("1.5", form=True, integer=True).startswith("'f': 1.5 is not an integer")
    assert message("NaN", form=True).startswith("'f': NaN is not a finite number")
    assert message("9" * 5000, form=True).startswith("'f': Infinity is not a finite number")
    assert message("x" * 10_000, form=True) == ("'f': expected a number in [-3.40282e+38, 3.40282e+38], "
                                                f"got \"{'x' * 80}\"...")
    assert Fields({"f": 2.0}).number("f", integer=True) == 2 and Fields({"f": "3"}, form=True).number("f") == 3
    assert Fields({"f": "0.5"}).number("f", strings=True) == 0.5


INTEGER, NUMBER = "integer", "number"
NUMERIC_FIELDS = [
    (CHAT, CHAT_OK, {"max_tokens": INTEGER, "max_completion_tokens": INTEGER, "temperature": NUMBER,
                     "top_p": NUMBER, "seed": INTEGER, "top_k": INTEGER, "n": INTEGER,
                     "presence_penalty": NUMBER, "frequency_penalty": NUMBER}),
    ("/v1/audio/speech", SPEECH_OK, {"speed": NUMBER, "seed": INTEGER, "temperature": NUMBER, "top_p": NUMBER,
                                     "top_k": INTEGER, "max_tokens": INTEGER}),
    ("/v1/images/generations", IMAGE_OK, {"n": INTEGER, "seed": INTEGER, "num_inference_steps": INTEGER,
                                          "guidance_scale": NUMBER}),
    ("/v1/videos", VIDEO_OK, {"seconds": NUMBER, "seed": INTEGER}),
]
# JSON literals no number field takes (NaN and Infinity as Python's json would read them)
ABSURD_JSON = ["1e308", "-1e308", "1e999", str(10**30), "NaN", "Infinity", "-Infinity", "true", "false", '"seven"',
               "[7]", '{"v": 7}', '""']
ABSURD_INTEGERS = ["1.5", '"7"', str(2**64), "-" + str(2**63 + 1)]      # and beyond int64 (seeds)


@pytest.mark.parametrize("path,ok,field,kind", [(p, ok, f, k) for p, ok, fields in NUMERIC_FIELDS
                                                for f, k in fields.items()],
                         ids=[f"{p.rsplit('/', 1)[1]}-{f}" for p, _, fields in NUMERIC_FIELDS for f in fields])
def test_absurd_numbers_are_refused_before_the_model(open_proxy, path, ok, field, kind):
    url, gateway = open_proxy
    calls = len(gateway.calls)
    for literal in ABSURD_JSON + (ABSURD_INTEGERS if kind == INTEGER else []):
        if literal == '"7"' and field == "seconds":
            continue                                # OpenAI sends a video's seconds as a string
        status, body, _ = call(url, path, json.dumps(ok)[:-1] + f', "{field}": {literal}}}')
        assert status == 400, (literal, body)
        assert body["error"]["param"] == field, (literal, body)
        assert body["error"]["code"] == "invalid_value"
    assert len(gateway.calls) == calls, "a refused request reached the model"


def test_max_tokens_1_5_and_1e308_are_refused_by_name(open_proxy):
    url, _ = open_proxy
    status, body, _ = call(url, CHAT, {**CHAT_OK, "max_tokens": 1.5})
    assert status == 400 and body["error"]["param"] == "max_tokens"
    assert body["error"]["message"].startswith("'max_tokens': 1.5 is not an integer")
    status, body, _ = call(url, CHAT, {**CHAT_OK, "max_completion_tokens": 1e308})
    assert status == 400 and body["error"]["param"] == "max_completion_tokens"
    assert "1e+308 is out of range" in body["error"]["message"]


OTHER_BAD = [
    (CHAT, CHAT_OK, {"model": 7}, "model"),
    (CHAT, CHAT_OK, {"messages": []}, "messages"),
    (CHAT, CHAT_OK, {"messages": "hi"}, "messages"),
    (CHAT, CHAT_OK, {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    (CHAT, CHAT_OK, {"messages": [{"role": ["x" * 9999], "content": "hi"}]}, "messages[0].role"),
    (CHAT, CHAT_OK, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (CHAT, CHAT_OK, {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (CHAT, CHAT_OK, {"stop": ""}, "stop"),
    (CHAT, CHAT_OK, {"stop_token_ids": [-1]}, "stop_token_ids"),
    (CHAT, CHAT_OK, {"stop_token_ids": [2**40]}, "stop_token_ids"),
    (CHAT, CHAT_OK, {"stop_token_ids": [1.5]}, "stop_token_ids"),
    (CHAT, CHAT_OK, {"stop_token_ids": [True]}, "stop_token_ids"),
    (CHAT, CHAT_OK, {"stream": "yes"}, "stream"),
    (CHAT, CHAT_OK, {"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    (CHAT, CHAT_OK, {"ignore_eos": 1}, "ignore_eos"),
    (CHAT, CHAT_OK, {"logit_bias": {"1": 500}}, "logit_bias"),
    (CHAT, CHAT_OK, {"chat_template_kwargs": []}, "chat_template_kwargs"),
    ("/v1/audio/speech", SPEECH_OK, {"input": "x" * 4097}, "input"),
    ("/v1/audio/speech", SPEECH_OK, {"input": 5}, "input"),
    ("/v1/audio/speech", SPEECH_OK, {"voice": 5}, "voice"),
    ("/v1/audio/speech", SPEECH_OK, {"response_format": "x" * 5000}, "response_format"),
    ("/v1/images/generations", IMAGE_OK, {"prompt": []}, "prompt"),
    ("/v1/images/generations", IMAGE_OK, {"size": "9999999x1"}, "size"),
    ("/v1/images/generations", IMAGE_OK, {"negative_prompt": False}, "negative_prompt"),
    ("/v1/videos", VIDEO_OK, {"seconds": "0"}, "seconds"),
    ("/v1/videos", VIDEO_OK, {"seconds": 601}, "seconds"),
]


@pytest.mark.parametrize("path,ok,change,param", OTHER_BAD, ids=[f"{c[3]}={json.dumps(c[2])[:30]}" for c in OTHER_BAD])
def test_bad_strings_and_lists_are_refused_by_name(open_proxy, path, ok, change, param):
    url, gateway = open_proxy
    calls = len(gateway.calls)
    status, body, _ = call(url, path, {**ok, **change})
    assert status == 400 and body["error"]["param"] == param, body
    assert len(body["error"]["message"]) < 400, "an error must not echo a long value whole"
    assert len(gateway.calls) == calls


def test_a_20_mb_prompt_is_refused_before_any_work(open_proxy):
    url, gateway = open_proxy
    calls = len(gateway.calls)
    body = {**CHAT_OK, "messages": [{"role": "user", "content": "word " * (4 << 20)}]}     # 20 MiB, under 32 MiB
    start = time.monotonic()
    status, answer, _ = call(url, CHAT, body)
    assert status == 400 and answer["error"]["param"] == "messages[0].content"
    assert answer["error"]["message"] == (f"'messages[0].content': has {20 << 20} characters; "
                                          f"at most {1 << 20} are accepted")
    assert time.monotonic() - start < 10 and len(gateway.calls) == calls


def test_chat_messages_are_bounded_in_all(tmp_path):
    with serving(app_over(Settings(max_text_chars=100), fake_gateway())) as url:
        two = [{"role": "user", "content": "x" * 60}, {"role": "assistant", "content": "y" * 60}]
        status, body, _ = call(url, CHAT, {**CHAT_OK, "messages": two})
        assert status == 400 and body["error"]["param"] == "messages"
        assert "100 characters in all" in body["error"]["message"]
        status, _, _ = call(url, CHAT, {**CHAT_OK, "messages": two[:1]})
        assert status == 200


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, 1, -1, 2, 7, 2**31, 2**63, -(2**63), 10**20, rng.randint(-10**6, 10**6)])
    if kind == 2:
        return rng.choice([0.5, 1.5, -0.0, 1e-300, 1e308, -1e308, 2.0, rng.uniform(-5, 5)])
    if kind == 3:
        return rng.choice([float("nan"), float("inf"), float("-inf")])
    if kind == 4:
        return rng.choice(["", "x", "user", "text", "stop", "\u0000", "\ud7ff" * 3, "7", "1e308", "NaN"])
    if kind == 5:
        return "z" * rng.choice([1000, 5000])
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {rng.choice(["role", "content", "type", "text", "include_usage", "a"]): random_value(rng, depth + 1)
            for _ in range(rng.randrange(4))}


CHAT_FIELDS = ["messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "top_k",
               "n", "stop", "stop_token_ids", "ignore_eos", "stream", "stream_options", "presence_penalty",
               "frequency_penalty", "logprobs", "response_format", "chat_template_kwargs", "tools"]


def test_random_chat_bodies_are_answered_or_refused_never_crash():
    """Seeded random mutations of a valid chat body: each is answered (its values, as they reach
    the model, in range) or refused with a 400 naming a field; never a 500."""
    gateway = fake_gateway()
    rng = random.Random(20240611)
    answered = refused_count = 0
    with serving(app_over(Settings(max_text_chars=2000), gateway)) as url:
        for _ in range(250):
            body = {**CHAT_OK, **{rng.choice(CHAT_FIELDS): random_value(rng) for _ in range(rng.randrange(1, 4))}}
            status, answer, _ = call(url, CHAT, json.dumps(body, allow_nan=True))
            assert status in (200, 400, 404), (body, answer)
            if status != 200:
                assert isinstance(answer["error"]["param"], str) and answer["error"]["param"], (body, answer)
                refused_count += 1
                continue
            answered += 1
            sampling = gateway.calls[-1][1].get("sampling_parameters", {})
            assert 1 <= sampling.get("max_tokens", 1) <= INT32_MAX and 0 <= sampling.get("temperature", 0) <= 2
            assert all(type(t) is int and 0 <= t <= INT32_MAX for t in sampling.get("stop_token_ids", []))
            assert -2**63 <= sampling.get("seed", 0) < 2**63
    assert answered >= 5 and refused_count > 100, (answered, refused_count)


# -- API keys -------------------------------------------------------------------------------------
def test_api_keys_are_read_from_flags_files_and_the_environment(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# team A\nfile-key-1\n\n  file-key-2  \nflag-key\n")
    env = {"OPENAI_PROXY_API_KEYS": "env-key-1, env-key-2,,", "OPENAI_PROXY_API_KEY": "old-key"}
    assert read_api_keys(["flag-key"], [keys], env) == ("flag-key", "file-key-1", "file-key-2", "env-key-1",
                                                        "env-key-2", "old-key")
    assert read_api_keys([], [], {}) == ()
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(ValueError, match="holds no API key"):
        read_api_keys([], [empty], {})
    with pytest.raises(SystemExit) as e:        # a proxy meant to be closed does not start open
        main(["--api-key-file", str(empty)])
    assert e.value.code == 2


def test_key_ring_matches_whole_keys_only():
    ring = KeyRing(["sk-one", "sk-two"])
    assert ring.match("sk-one") != ring.match("sk-two") and ring.match("sk-two") is not None
    for wrong in ("", "sk-on", "sk-one ", "sk-onex", "SK-ONE"):
        assert ring.match(wrong) is None


def test_keys_from_a_file_and_the_environment_open_the_proxy(tmp_path, monkeypatch):
    (tmp_path / "keys").write_text("file-key\n")
    monkeypatch.setenv("OPENAI_PROXY_API_KEYS", "env-key-1,env-key-2")
    monkeypatch.delenv("OPENAI_PROXY_API_KEY", raising=False)
    settings = settings_of(parser().parse_args(["--api-key-file", str(tmp_path / "keys")]))
    assert settings.api_keys == ("file-key", "env-key-1", "env-key-2")
    with serving(app_over(settings, fake_gateway())) as url:
        for key in settings.api_keys:
            status, body, _ = call(url, "/v1/models", key=key, method="GET", content_type=None)
            assert status == 200 and {m["id"] for m in body["data"]} >= {"fake_chat"}
        status, body, _ = call(url, "/v1/models", key=None, method="GET", content_type=None)
        assert status == 401 and body["error"]["code"] == "invalid_api_key" and "Missing" in body["error"]["message"]
        for key in ("wrong", "file-key,env-key-1", "env-key-"):
            status, body, _ = call(url, "/v1/models", key=key, method="GET", content_type=None)
            assert status == 401 and body["error"]["message"] == "Incorrect API key provided"
        status, _, _ = call(url, "/v1/models", key=None, method="GET", content_type=None,
                            headers={"Authorization": "Basic file-key"})
        assert status == 401
        status, _, _ = call(url, CHAT, CHAT_OK, key="wrong")
        assert status == 401
        status, _, _ = call(url, "/health", key=None, method="GET", content_type=None)
        assert status == 200, "health needs no key"


# -- size limits ----------------------------------------------------------------------------------
def test_bodies_and_uploads_above_their_limits_get_413():
    gateway = fake_gateway()
    with serving(app_over(Settings(max_body_bytes=4000, max_upload_bytes=100), gateway)) as url:
        status, body, _ = call(url, CHAT, {**CHAT_OK, "messages": [{"role": "user", "content": "x" * 5000}]})
        assert status == 413 and body["error"]["code"] == "request_too_large"
        sdk = openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=30)
        try:
            with pytest.raises(openai.APIStatusError) as e:
                sdk.audio.transcriptions.create(model="fake_asr", file=("a.wav", b"R" * 101, "audio/wav"))
            assert e.value.status_code == 413
            assert (e.value.body["code"], e.value.body["param"]) == ("file_too_large", "file")
            with pytest.raises(openai.APIStatusError) as e:
                sdk.images.edit(model="fake_edit", prompt="x", image=("a.png", b"P" * 200, "image/png"))
            assert e.value.status_code == 413 and e.value.body["param"] == "image"
            assert sdk.audio.transcriptions.create(model="fake_asr", file=("a.wav", b"R" * 100, "audio/wav")).text
            with pytest.raises(openai.BadRequestError) as e:        # a form's numbers: the same checks
                sdk.images.edit(model="fake_edit", prompt="x", image=("a.png", b"P", "image/png"),
                                extra_body={"n": "1.5"})
            assert e.value.body["param"] == "n" and "not an integer" in e.value.body["message"]
        finally:
            sdk.close()
    assert [c[0] for c in gateway.calls] == ["fake_asr"]


# -- rate limit -----------------------------------------------------------------------------------
def test_rate_limiter_is_a_token_bucket():
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=3, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(1.0) and limiter.take("b") == 0.0
    now[0] = 0.5
    assert limiter.take("a") == pytest.approx(0.5)
    now[0] = 1.0
    assert limiter.take("a") == 0.0 and limiter.take("a") == pytest.approx(1.0)
    now[0] = 100.0                                   # refilled to the burst, no further
    assert [limiter.take("a") for _ in range(4)][3] == pytest.approx(1.0)
    assert RateLimiter(per_minute=120).burst == 120


def test_rate_limiter_forgets_idle_clients(monkeypatch):
    monkeypatch.setattr("triton_omni.client.openai_proxy.guards.MAX_CLIENTS", 3)
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=1, clock=lambda: now[0])
    for client in "abc":
        limiter.take(client)
    now[0] = 10.0
    limiter.take("d")
    assert set(limiter.buckets) == {"d"}


def test_429_with_retry_after_per_key_then_the_request_goes():
    settings = Settings(api_keys=("k1", "k2"), rate_limit_per_minute=60, rate_limit_burst=2)
    with serving(app_over(settings, fake_gateway())) as url:
        def models(key):
            return call(url, "/v1/models", key=key, method="GET", content_type=None)

        assert [models("k1")[0], models("k1")[0]] == [200, 200]
        status, body, headers = models("k1")
        assert status == 429 and headers["Retry-After"] == "1"
        assert body["error"]["code"] == "rate_limit_exceeded" and body["error"]["type"] == "requests"
        assert models("k2")[0] == 200, "each key has its own bucket"
        assert models("wrong")[0] == 401
        time.sleep(int(headers["Retry-After"]))
        assert models("k1")[0] == 200


# -- errors without internals ---------------------------------------------------------------------
class BrokenGateway(FakeGateway):
    async def stream(self, model, values, disconnected=None, param_of=None, batched=True):
        raise RuntimeError("secret detail from /srv/model.py line 42")
        yield  # noqa: unreachable - makes this an async generator like the real one


def test_an_internal_error_is_a_500_without_a_traceback(caplog):
    gateway = BrokenGateway(fake_gateway().routes, {})
    with caplog.at_level(logging.ERROR), serving(app_over(Settings(), gateway)) as url:
        status, body, _ = call(url, "/v1/images/generations", IMAGE_OK)
        assert status == 500 and set(body) == {"error"}
        assert (body["error"]["code"], body["error"]["type"]) == ("internal_error", "server_error")
        message = body["error"]["message"]
        assert "secret" not in message and "Traceback" not in message and "RuntimeError" not in message
        error_id = re.search(r"error id ([0-9a-f]{12})", message).group(1)
        status, job, _ = call(url, "/v1/videos", VIDEO_OK)
        deadline = time.monotonic() + 10
        while job["status"] != "failed":
            assert time.monotonic() < deadline, job
            time.sleep(0.05)
            job = call(url, f"/v1/videos/{job['id']}", method="GET", content_type=None)[1]
        assert job["error"]["code"] == "internal_error" and "secret" not in job["error"]["message"]
    logged = [r for r in caplog.records if r.name == "openai_proxy" and error_id in r.getMessage()]
    assert logged and "secret detail" in str(logged[0].exc_info[1])


class TritonError(Exception):
    def __init__(self, text, status):
        self.text, self.code = text, status

    def message(self):
        return self.text

    def status(self):
        return self.code


def test_model_errors_lose_their_python_stack():
    stack = "\n\nAt:\n  /srv/python_backends/x/steps.py(10): parse\n  /srv/model.py(3): execute\n"
    e = from_triton(TritonError("in ensemble 'e', field 'size': must be > 0" + stack, "StatusCode.INVALID_ARGUMENT"))
    assert (e.status, e.param, e.message) == (400, "size", "field 'size': must be > 0")
    e = from_triton(TritonError("TypeError: bad operand" + stack, "StatusCode.INTERNAL"))
    assert e.status == 500 and e.code == "model_error"
    assert "TypeError" not in e.message and "At:" not in e.message and "error id" in e.message
    e = from_triton(TritonError("x" * 10_000 + "field 'prompt': too long", "StatusCode.INVALID_ARGUMENT"))
    assert e.status == 400 and len(e.message) < 2100


# -- CORS -----------------------------------------------------------------------------------------
PREFLIGHT = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type"}


def test_cors_headers_only_when_configured():
    with serving(app_over(Settings(), fake_gateway())) as url:
        _, _, headers = call(url, "/v1/models", method="GET", content_type=None,
                             headers={"Origin": "https://app.example"})
        assert "access-control-allow-origin" not in {k.lower() for k in headers}
        status, _, headers = call(url, "/v1/models", method="OPTIONS", content_type=None, headers=PREFLIGHT)
        assert status == 405 and "access-control-allow-origin" not in {k.lower() for k in headers}
    settings = Settings(api_keys=("k",), cors_origins=("https://app.example",))
    with serving(app_over(settings, fake_gateway())) as url:
        status, _, headers = call(url, "/v1/models", key="k", method="GET", content_type=None,
                                  headers={"Origin": "https://app.example"})
        assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
        status, _, headers = call(url, CHAT, method="OPTIONS", content_type=None, headers=PREFLIGHT)
        assert status == 200, "a preflight carries no key"
        assert headers["access-control-allow-origin"] == "https://app.example"
        assert "POST" in headers["access-control-allow-methods"]
        assert "authorization" in headers["access-control-allow-headers"].lower()
        _, _, headers = call(url, "/v1/models", key="k", method="GET", content_type=None,
                             headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in {k.lower() for k in headers}


# -- deadlines on Triton calls --------------------------------------------------------------------
class EndlessClient:
    """Stands in for tritonclient's gRPC client: records each call's deadline; its stream answers a
    non-final response every 20 ms, forever."""

    made: list["EndlessClient"] = []

    def __init__(self, url):
        self.timeouts, self.stopped, self.cancelled = {}, threading.Event(), None
        EndlessClient.made.append(self)

    def get_model_repository_index(self, as_json=False, client_timeout=None):
        self.timeouts["index"] = client_timeout
        return {"models": []}

    def get_model_config(self, name, as_json=False, client_timeout=None):
        self.timeouts["config"] = client_timeout
        return {"config": {}}

    def is_server_live(self, client_timeout=None):
        self.timeouts["live"] = client_timeout
        return True

    def start_stream(self, callback, stream_timeout=None):
        self.callback, self.timeouts["stream"] = callback, stream_timeout

    def async_stream_infer(self, model, inputs, **kw):
        response = SimpleNamespace(outputs=[SimpleNamespace(name="t")], parameters={})      # never final
        reply = SimpleNamespace(get_response=lambda: response, as_numpy=lambda name: np.array([[b"x"]], np.object_))
        threading.Thread(target=self._answer, args=(reply,), daemon=True).start()

    def _answer(self, reply):
        while not self.stopped.wait(0.02):
            self.callback(reply, None)

    def stop_stream(self, cancel_requests=False):
        self.cancelled = cancel_requests
        self.stopped.set()

    def close(self):
        pass


def test_every_triton_call_has_a_deadline(monkeypatch):
    from triton_omni.client.openai_proxy import triton

    monkeypatch.setattr(triton.grpcclient, "InferenceServerClient", EndlessClient)
    EndlessClient.made = []
    gateway = triton.TritonGateway("localhost:1", timeout_s=0.5)

    async def run():
        await gateway.ready_models()
        await gateway.model_config("m")
        assert await gateway.live()
        start = time.monotonic()
        with pytest.raises(ProxyError) as e:
            await asyncio.wait_for(gateway.collect("m", {"x": ("hi", "BYTES")}), 5)
        return e.value, time.monotonic() - start

    error, took = asyncio.run(run())
    assert (error.status, error.code) == (504, "timeout") and 0.5 <= took < 2, took
    control, stream = EndlessClient.made
    assert control.timeouts == {"index": triton.CONTROL_TIMEOUT_S, "config": triton.CONTROL_TIMEOUT_S,
                                "live": triton.CONTROL_TIMEOUT_S}
    assert stream.timeouts == {"stream": 0.5 + triton.STREAM_GRACE_S}
    assert stream.stopped.wait(5) and stream.cancelled is True, "the timed-out request is cancelled in Triton"


# -- video jobs are bounded -----------------------------------------------------------------------
class StuckGateway(FakeGateway):
    async def stream(self, model, values, disconnected=None, param_of=None, batched=True):
        await asyncio.Event().wait()
        yield {}


def test_video_jobs_past_the_limit_get_429():
    gateway = StuckGateway(fake_gateway().routes, {})
    with serving(app_over(Settings(max_video_jobs=1), gateway)) as url:
        status, job, _ = call(url, "/v1/videos", VIDEO_OK)
        assert status == 200
        status, body, headers = call(url, "/v1/videos", VIDEO_OK)
        assert status == 429 and body["error"]["code"] == "too_many_jobs" and headers["Retry-After"] == "30"
        status, _, _ = call(url, f"/v1/videos/{job['id']}", method="DELETE", content_type=None)
        assert status == 200
        assert call(url, "/v1/videos", VIDEO_OK)[0] == 200
