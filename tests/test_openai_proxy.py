"""The OpenAI-compatible proxy, driven by the official `openai` SDK.

Live: `python -m triton_omni.client.openai_proxy` (a real uvicorn process) in front of a real tritonserver
serving qwen3_chat: answers equal ChatClient's, usage, /v1/models, errors, API key, cancellation.
Contract: the other routes (speech, voices, transcription, images, videos) in-process against a
fake gateway that records the tensors each request becomes and answers canned outputs, so the
mapping onto ensemble_configs/README.md's contract is checked without those models.
"""
from __future__ import annotations

import base64
import contextlib
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest

from triton_omni.client.chat import ChatClient
from triton_omni.launcher.triton import free_port
from tests.conftest import ROOT, running_server

API_KEY = "sk-test-key"
BODY_LIMIT = 1 << 20
GREEDY = {"max_tokens": 24, "temperature": 0, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]


# -- live: proxy process + tritonserver ----------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("proxy"), ["qwen3_chat"], ["qwen3_chat.ar.max_num_seqs=8"]) as s:
        yield s


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"proxy exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    pytest.fail(f"proxy not healthy after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def running_proxy(triton_url: str, log: Path, *args: str):
    """`python -m triton_omni.client.openai_proxy` in front of `triton_url`, as a user starts it (extra `args`
    appended); yields its base URL once healthy, stops it after."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "triton_omni.client.openai_proxy", "--triton-url", triton_url,
                                 "--port", str(port), "--log-level", "warning", *args], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def proxy(server, tmp_path_factory):
    """The proxy's own command line, as a user starts it."""
    log = tmp_path_factory.mktemp("proxy_process") / "proxy.log"
    with running_proxy(server.grpc_url, log, "--api-key", API_KEY, "--max-body-bytes", str(BODY_LIMIT)) as url:
        yield url


@pytest.fixture
def sdk(proxy):
    client = openai.OpenAI(api_key=API_KEY, base_url=f"{proxy}/v1", max_retries=0, timeout=60)
    yield client
    client.close()


def request(url: str, path: str, body=None, content_type: str | None = "application/json", key: str | None = API_KEY,
            headers: dict | None = None, method: str = "POST"):
    """A raw HTTP request: (status, parsed JSON or text). For what the SDK will not send."""
    status, body, _ = request_with_headers(url, path, body, content_type, key, headers, method)
    return status, body


def request_with_headers(url: str, path: str, body=None, content_type: str | None = "application/json",
                         key: str | None = API_KEY, headers: dict | None = None, method: str = "POST"):
    """`request`, and the answer's headers too: (status, parsed JSON or text, headers)."""
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    h = {**({"Content-Type": content_type} if content_type else {}), **({"Authorization": f"Bearer {key}"} if key else {}),
         **(headers or {})}
    req = urllib.request.Request(url + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw, status, got = r.read(), r.status, r.headers
    except urllib.error.HTTPError as e:
        raw, status, got = e.read(), e.code, e.headers
    try:
        return status, json.loads(raw), got
    except ValueError:
        return status, raw.decode(), got


def chat_client_answer(server, **sampling):
    chunks = list(ChatClient(server.grpc_url, timeout_s=60).stream("qwen3_chat", messages=MESSAGES, sampling=sampling))
    return "".join(c.text for c in chunks), chunks[-1]


def metric(server, name: str, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    m = re.search(rf'^{name}{{model="{model}"}} ([0-9.e+]+)$', text, re.M)
    assert m, f"{name} for {model} not in /metrics"
    return float(m.group(1))


@pytest.mark.server
def test_models_lists_what_triton_has_ready(sdk):
    # Every YAML with an openai route offers a model, but only qwen3_chat is loaded on this server.
    assert [m.id for m in sdk.models.list()] == ["qwen3_chat"]
    assert sdk.models.retrieve("qwen3_chat").owned_by == "triton-omni"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("qwen3_5_chat")


@pytest.mark.server
def test_non_streamed_answer_equals_chat_client(server, sdk):
    want, last = chat_client_answer(server, **GREEDY)
    r = sdk.chat.completions.create(model="qwen3_chat", messages=MESSAGES, temperature=0, max_tokens=24,
                                    extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.model == "qwen3_chat" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want and want
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (last.prompt_tokens, 24)
    assert r.usage.total_tokens == last.prompt_tokens + 24


@pytest.mark.server
def test_streamed_answer_equals_chat_client_with_usage(server, sdk):
    want, last = chat_client_answer(server, **GREEDY)
    chunks = list(sdk.chat.completions.create(model="qwen3_chat", messages=MESSAGES, temperature=0,
                                              max_completion_tokens=24, stream=True,
                                              stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    text_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(text_chunks) > 2, "the answer should arrive in pieces"
    assert "".join(c.choices[0].delta.content for c in text_chunks) == want
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    # include_usage: every chunk carries usage null, and a last chunk with no choices carries it.
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == last.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


@pytest.mark.server
def test_stream_wire_format_ends_with_done(proxy):
    # seeded: an unseeded sample of the tiny random model can end on EOS within 4 tokens ("stop")
    body = {"model": "qwen3_chat", "messages": MESSAGES, "max_tokens": 4, "stream": True, "seed": 7, "ignore_eos": True}
    req = urllib.request.Request(f"{proxy}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        frames = [line.decode().rstrip("\n") for line in r if line.strip()]
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    payloads = [json.loads(f[6:]) for f in frames[:-1]]
    assert all("usage" not in p for p in payloads), "usage only with stream_options.include_usage"
    assert payloads[-1]["choices"][0]["finish_reason"] == "length" and payloads[-1]["choices"][0]["delta"] == {}


@pytest.mark.server
def test_sampling_fields_reach_the_model(server, sdk):
    def ask(**kw):
        r = sdk.chat.completions.create(model="qwen3_chat", messages=MESSAGES, **kw)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens

    seeded = dict(temperature=1.0, top_p=0.9, max_tokens=16, extra_body={"ignore_eos": True})
    a, b, c = ask(seed=11, **seeded), ask(seed=11, **seeded), ask(seed=12, **seeded)
    assert a == b and a[0] != c[0], "seed must make sampling reproducible"
    assert ask(max_completion_tokens=5, extra_body={"ignore_eos": True})[2] == 5
    full, _, _ = ask(temperature=0, max_tokens=24, extra_body={"ignore_eos": True})
    # A stop string from the answer's middle (random weights: skip U+FFFD, which is no real text).
    start = next(i for i in range(6, len(full) - 3) if "\ufffd" not in full[i:i + 3])
    stop = full[start:start + 3]
    cut, reason, _ = ask(temperature=0, max_tokens=24, stop=[stop], extra_body={"ignore_eos": True})
    assert cut == full[:full.find(stop)] and reason == "stop"
    parts = [{"type": "text", "text": "Write a haiku "}, {"type": "text", "text": "about the sea."}]
    r = sdk.chat.completions.create(model="qwen3_chat", messages=[{"role": "user", "content": parts}],
                                    temperature=0, max_tokens=24, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == full, "text parts are joined into one message"


BAD = [
    ("unknown model", {"model": "no_such_model"}, openai.NotFoundError, "model", "model_not_found"),
    ("temperature not a number", {"temperature": "hot"}, openai.BadRequestError, "temperature", "invalid_value"),
    ("temperature out of range", {"temperature": 5}, openai.BadRequestError, "temperature", "invalid_value"),
    ("n above 16", {"n": 17}, openai.BadRequestError, "n", "invalid_value"),
    ("top_p zero", {"top_p": 0}, openai.BadRequestError, "top_p", "invalid_value"),
    ("image content", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     openai.BadRequestError, "messages[0].content[0]", "invalid_value"),
    # Rejected by the model itself (Triton INVALID_ARG): 400 with Triton's message, mapped to the field.
    ("max_tokens beyond the context", {"max_tokens": 5000}, openai.BadRequestError, "max_tokens", "invalid_value"),
]


@pytest.mark.server
@pytest.mark.parametrize("case,fields,error,param,code", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_name_the_field(sdk, case, fields, error, param, code):
    with pytest.raises(error) as e:
        sdk.chat.completions.create(**{"model": "qwen3_chat", "messages": MESSAGES, **fields})
    assert e.value.body["param"] == param and e.value.body["code"] == code
    assert set(e.value.body) == {"message", "type", "param", "code"}
    if case == "max_tokens beyond the context":
        assert "5000 does not fit" in e.value.body["message"]


@pytest.mark.server
def test_raw_http_errors(proxy):
    chat = "/v1/chat/completions"
    status, body = request(proxy, chat, {"model": "qwen3_chat"})
    assert status == 400 and body["error"]["param"] == "messages" and "messages" in body["error"]["message"]
    status, body = request(proxy, chat, b"model=qwen3_chat", content_type="application/x-www-form-urlencoded")
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    status, body = request(proxy, chat, b"{not json")
    assert status == 400 and body["error"]["code"] == "invalid_json"
    big = json.dumps({"model": "qwen3_chat", "messages": [{"role": "user", "content": "x" * BODY_LIMIT}]}).encode()
    status, body = request(proxy, chat, big)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    # Without a Content-Length (chunked), the limit holds while reading.
    chunks = iter([b"{" + b" " * 65536] * 20 + [b"}"])
    status, body = request(proxy, chat, chunks, headers={"Transfer-Encoding": "chunked"})
    assert status == 413
    status, body = request(proxy, "/v1/nowhere", {})
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}


@pytest.mark.server
def test_api_key(proxy):
    wrong = openai.OpenAI(api_key="sk-wrong", base_url=f"{proxy}/v1", max_retries=0)
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            wrong.models.list()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    finally:
        wrong.close()
    status, body = request(proxy, "/v1/models", None, content_type=None, key=None, method="GET")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, _ = request(proxy, "/health", None, content_type=None, key=None, method="GET")
    assert status == 200, "health needs no key"


@pytest.mark.server
def test_interrupted_stream_stops_decoding(server, sdk):
    """A client that hangs up mid-stream: the proxy cancels the Triton stream, decoding stops."""
    steps = lambda: metric(server, "triton_omni_ar_decode_steps", "qwen3_chat_ar")  # noqa: E731
    stream = sdk.chat.completions.create(model="qwen3_chat", messages=MESSAGES, max_tokens=1800, stream=True,
                                         extra_body={"ignore_eos": True})
    pieces = iter(stream)
    for _ in range(3):
        next(pieces)
    before = steps()
    time.sleep(0.5)
    assert steps() > before, "the request should be decoding"
    stream.close()
    deadline = time.monotonic() + 5
    while True:
        a = steps()
        time.sleep(0.5)
        if steps() == a:
            break
        assert time.monotonic() < deadline, "decoding went on after the client hung up"
    # ignore_eos: sampled, the tiny model's EOS (2 of 512 tokens) ended this answer at 3 tokens in one CI run
    r = sdk.chat.completions.create(model="qwen3_chat", messages=MESSAGES, max_tokens=4,
                                    extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4


NO_MODEL = [
    ("speech", lambda c: c.audio.speech.create(model="orpheus_tts", input="hi", voice="tara")),
    ("transcription", lambda c: c.audio.transcriptions.create(model="whisper", file=("a.wav", b"RIFF", "audio/wav"))),
    ("image_generation", lambda c: c.images.generate(prompt="a fox")),
    ("image_edit", lambda c: c.images.edit(prompt="blue", image=("a.png", b"\x89PNG", "image/png"))),
    ("video", lambda c: c.videos.create(prompt="waves")),
]


@pytest.mark.server
@pytest.mark.filterwarnings("ignore:The Sora API")
@pytest.mark.parametrize("route,call", NO_MODEL, ids=[n[0] for n in NO_MODEL])
def test_routes_without_a_model_say_so(sdk, route, call):
    with pytest.raises(openai.NotFoundError) as e:
        call(sdk)
    assert e.value.body["code"] == "model_not_found"
    assert e.value.body["message"].startswith("no model serves this route")


# -- contract: the other routes against a fake gateway --------------------------------------------
def _strings(*items: bytes) -> np.ndarray:
    return np.array(list(items), dtype=np.object_)


class FakeGateway:
    """Stands in for TritonGateway: records (model, values) and answers canned outputs."""

    def __init__(self, routes: dict[str, str], replies: dict[str, list[dict]]):
        self.routes, self.replies, self.calls = routes, replies, []
        self.ready = set(routes) | {f"{name}_pre" for name in routes}   # steps: ready, but no route

    async def ready_models(self):
        return self.ready

    async def model_config(self, name):
        # as the converter writes the config of the model clients call
        route = self.routes.get(name)
        return {"name": name, "parameters": {} if route is None else {
            "openai_route": {"string_value": route}, "openai_description": {"string_value": f"{name} (fake)"}}}

    async def live(self):
        return True

    async def stream(self, model, values, disconnected=None, param_of=None, batched=True):
        self.calls.append((model, {k: v for k, (v, _) in values.items() if v is not None},
                           {k: t for k, (v, t) in values.items() if v is not None}))
        for outputs in self.replies[model]:
            yield outputs

    async def collect(self, model, values, disconnected=None, param_of=None, batched=True):
        return [o async for o in self.stream(model, values, disconnected, param_of)]

    def close(self):
        pass


FAKE_ROUTES = {"fake_tts": "speech", "fake_asr": "transcription", "fake_image": "image_generation",
               "fake_edit": "image_edit", "fake_video": "video", "fake_chat": "chat"}
PCM = [b"\x01\x00" * 50, b"\x02\x00" * 30]


def fake_gateway() -> FakeGateway:
    """A model for every route, each answering canned outputs."""
    return FakeGateway(FAKE_ROUTES, {
        "fake_tts": [{"audio": _strings(p), "sample_rate": np.array([24000], np.int32),
                      "finish_reason": _strings(b"stop" if i else b"")} for i, p in enumerate(PCM)],
        "fake_asr": [{"text": _strings("hello world".encode())}],
        "fake_image": [{"images": _strings(b"IMG1", b"IMG2")}],
        "fake_edit": [{"images": _strings(b"EDITED")}],
        "fake_video": [{"video": _strings(b"MP4DATA")}],
        "fake_chat": [{"text_output": _strings(b"Hi there"), "finish_reason": _strings(b"stop"),
                       "prompt_tokens": np.array([5], np.int32), "completion_tokens": np.array([2], np.int32)}],
    })


def app_over(settings, gateway):
    """The proxy app with `settings`, its Triton gateway replaced by `gateway`."""
    from triton_omni.client.openai_proxy.app import create_app
    from triton_omni.client.openai_proxy.models import ModelTable

    app = create_app(settings)
    proxy = app.state.proxy
    proxy.gateway = proxy.videos.gateway = gateway
    proxy.models = ModelTable(gateway)
    return app


@contextlib.contextmanager
def serving(app):
    """`app` served by uvicorn in a thread on a free port; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "in-process proxy did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """The proxy app in-process (uvicorn in a thread) over a fake gateway with a model for every route."""
    from triton_omni.client.openai_proxy.context import Settings

    tmp = tmp_path_factory.mktemp("fake_proxy")
    gateway = fake_gateway()
    with serving(app_over(Settings(voices_dir=tmp / "voices"), gateway)) as url:
        client = openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=30)
        try:
            yield client, gateway, tmp
        finally:
            client.close()


def last_call(gateway):
    return gateway.calls[-1]


def test_models_are_read_from_the_model_configs(fake):
    sdk, _, _ = fake
    listed = {m.id: m for m in sdk.models.list()}
    assert set(listed) == set(FAKE_ROUTES)          # the ready steps have no route: not listed
    assert {m.route for m in listed.values()} == set(FAKE_ROUTES.values())
    assert listed["fake_tts"].description == "fake_tts (fake)"


def test_speech_pcm_streams_raw_bytes_with_headers(fake):
    sdk, gw, _ = fake
    with sdk.audio.speech.with_streaming_response.create(model="fake_tts", input="Hello", voice="tara",
                                                         response_format="pcm", speed=1.5,
                                                         extra_body={"seed": 3}) as r:
        assert r.headers["x-audio-sample-rate"] == "24000" and r.headers["x-audio-channels"] == "1"
        assert r.headers["content-type"] == "audio/pcm"
        body = b"".join(r.iter_bytes())
    assert body == b"".join(PCM)
    model, values, types = last_call(gw)
    assert model == "fake_tts"
    assert values == {"text": "Hello", "voice": "tara", "response_format": "pcm", "stream": True, "speed": 1.5,
                      "sampling_parameters": {"seed": 3}}
    assert types == {"text": "BYTES", "voice": "BYTES", "response_format": "BYTES", "stream": "BOOL",
                     "speed": "FP32", "sampling_parameters": "BYTES"}


def test_speech_instructions_and_language_reach_the_model(fake):
    sdk, gw, _ = fake
    sdk.audio.speech.create(model="fake_tts", input="Hello", voice="tara", response_format="wav",
                            instructions="Speak slowly.", extra_body={"language": "German"}).read()
    _, values, types = last_call(gw)
    assert (values["instructions"], values["language"]) == ("Speak slowly.", "German")
    assert types["instructions"] == types["language"] == "BYTES"


def test_speech_sse_events(fake):
    sdk, gw, _ = fake
    with sdk.audio.speech.with_streaming_response.create(model="fake_tts", input="Hello", voice="tara",
                                                         response_format="pcm", stream_format="sse") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.delta", "speech.audio.done"]
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == b"".join(PCM)
    assert set(events[-1]["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}


def test_speech_file_formats_ask_for_the_whole_file(fake):
    sdk, gw, _ = fake
    audio = sdk.audio.speech.create(model="fake_tts", input="Hello", voice="tara", response_format="wav")
    assert audio.content == b"".join(PCM)    # the file, from however many responses
    _, values, _ = last_call(gw)
    assert values["response_format"] == "wav" and values["stream"] is False
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.speech.create(model="fake_tts", input="Hello", voice="tara", response_format="aac")
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.speech.create(model="fake_tts", input="Hello", voice="tara", speed=9)
    assert e.value.body["param"] == "speed"


def test_uploaded_voice_is_sent_as_reference(fake):
    sdk, gw, tmp = fake
    clip = b"RIFF....WAVEfmt fake clip"
    voice = sdk.audio.voices.create(audio_sample=("me.wav", clip, "audio/wav"), consent="cons_1", name="narrator",
                                    extra_body={"transcript": "This is my voice."})
    assert voice.object == "audio.voice" and voice.name == "narrator" and voice.id.startswith("voice_")
    assert (tmp / "voices" / f"{voice.id}.audio").read_bytes() == clip, "kept on disk with --voices-dir"
    with pytest.raises(openai.ConflictError):
        sdk.audio.voices.create(audio_sample=("me.wav", clip, "audio/wav"), consent="cons_1", name="narrator")
    for by in ("narrator", {"id": voice.id}):
        sdk.audio.speech.create(model="fake_tts", input="Read this.", voice=by, response_format="wav")
        _, values, _ = last_call(gw)
        assert values["reference_audio"] == clip and values["reference_text"] == "This is my voice."
        assert "voice" not in values
    listed = sdk.get("/audio/voices", cast_to=object)
    assert [v["name"] for v in listed["data"]] == ["narrator"]
    deleted = sdk.audio.voices.delete(voice.id)
    assert deleted.deleted and not (tmp / "voices" / f"{voice.id}.audio").exists()
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.speech.create(model="fake_tts", input="Hi", voice={"id": voice.id}, response_format="wav")
    assert e.value.body["param"] == "voice"


def test_voice_store_reloads_from_disk(tmp_path):
    from triton_omni.client.openai_proxy.voices import VoiceStore

    store = VoiceStore(tmp_path)
    v = store.add("amy", b"audio bytes", "hello")
    again = VoiceStore(tmp_path)
    assert again.find("amy").audio == b"audio bytes" and again.find(v.id).transcript == "hello"
    with pytest.raises(KeyError):
        again.add("amy", b"x", "")


def test_transcription(fake):
    sdk, gw, _ = fake
    r = sdk.audio.transcriptions.create(model="fake_asr", file=("a.wav", b"RIFFDATA", "audio/wav"), language="en")
    assert r.text == "hello world"
    _, values, types = last_call(gw)
    assert values == {"audio": b"RIFFDATA", "language": "en"} and types["audio"] == "BYTES"
    text = sdk.audio.transcriptions.create(model="fake_asr", file=("a.wav", b"RIFFDATA", "audio/wav"),
                                           response_format="text")
    assert text.strip() == "hello world"


def test_image_generation(fake):
    sdk, gw, _ = fake
    r = sdk.images.generate(model="fake_image", prompt="a fox", n=2, size="256x128", output_format="webp",
                            extra_body={"seed": 7, "num_inference_steps": 4, "guidance_scale": 3.5,
                                        "negative_prompt": "blur"})
    assert [base64.b64decode(d.b64_json) for d in r.data] == [b"IMG1", b"IMG2"]
    assert r.output_format == "webp" and r.size == "256x128"
    _, values, types = last_call(gw)
    assert values == {"prompt": "a fox", "negative_prompt": "blur", "size": "256x128", "num_inference_steps": 4,
                      "guidance_scale": 3.5, "seed": 7, "n": 2, "output_format": "webp"}
    assert types == {"prompt": "BYTES", "negative_prompt": "BYTES", "size": "BYTES", "num_inference_steps": "INT32",
                     "guidance_scale": "FP32", "seed": "INT64", "n": "INT32", "output_format": "BYTES"}
    for bad, param in (({"size": "big"}, "size"), ({"n": 0}, "n"), ({"response_format": "url"}, "response_format")):
        with pytest.raises(openai.BadRequestError) as e:
            sdk.images.generate(model="fake_image", prompt="a fox", **bad)
        assert e.value.body["param"] == param
    # One image model on the route: `model` may be left out.
    assert len(sdk.images.generate(prompt="a fox").data) == 2


def test_image_edit_sends_every_image(fake):
    sdk, gw, _ = fake
    r = sdk.images.edit(model="fake_edit", prompt="make it blue", n=1, extra_body={"seed": "5"},
                        image=[("a.png", b"PNG-A", "image/png"), ("b.png", b"PNG-B", "image/png")])
    assert base64.b64decode(r.data[0].b64_json) == b"EDITED"
    _, values, types = last_call(gw)
    assert values["image"] == [b"PNG-A", b"PNG-B"] and values["prompt"] == "make it blue" and values["seed"] == 5
    assert types["image"] == "BYTES"


@pytest.mark.filterwarnings("ignore:The Sora API")
def test_video_job(fake):
    sdk, gw, _ = fake
    job = sdk.videos.create(model="fake_video", prompt="waves at dusk", seconds="4", size="320x192",
                            input_reference=("first.png", b"FIRST-FRAME", "image/png"))
    assert job.object == "video" and job.status in ("queued", "in_progress", "completed")
    deadline = time.monotonic() + 10
    while (job := sdk.videos.retrieve(job.id)).status != "completed":
        assert job.status != "failed" and time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job.progress == 100 and job.seconds == "4" and job.size == "320x192"
    assert sdk.videos.download_content(job.id).content == b"MP4DATA"
    _, values, types = last_call(gw)
    assert values == {"prompt": "waves at dusk", "size": "320x192", "seconds": 4.0, "image": b"FIRST-FRAME"}
    assert types["seconds"] == "FP32" and types["image"] == "BYTES"
    with pytest.raises(openai.NotFoundError):
        sdk.videos.retrieve("video_nope")


def test_proxy_cli_help():
    out = subprocess.run([sys.executable, "-m", "triton_omni.client.openai_proxy", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "--triton-url" in out.stdout and "--api-key" in out.stdout
