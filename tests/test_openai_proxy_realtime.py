"""The proxy's realtime API (WebSocket /v1/realtime) in front of a live tritonserver serving the cascade's
three tiny models: omniasr_ctc (speech to text) -> qwen3_chat -> kokoro_tts (text to speech).

Live: the proxy's own process, a WebSocket client (websocket-client). Each answer is checked against
the same requests sent straight to Triton with the project's clients: the transcript equals
TranscribeClient's on the same audio, the text equals ChatClient's greedy answer to the same
conversation (so the history reached the model), the audio has the samples the speech model makes
for those sentences (kokoro's noise is unseeded: the length is checked, and that the audio is not
silent), resampled when the session asks for another rate. Bad events get error events naming what
was wrong and the session goes on; cancelling (or closing the socket) stops the speech requests.
"""
from __future__ import annotations

import base64
import json
import math
import time

import numpy as np
import pytest
import websocket

from triton_omni.client.chat import ChatClient
from triton_omni.client.openai_proxy.realtime_cascade import Sentences
from triton_omni.client.openai_proxy.realtime_session import wav_of
from triton_omni.client.speech import SpeechClient
from triton_omni.client.transcribe import TranscribeClient
from tests.conftest import running_server, step_counts
from tests.test_openai_proxy import metric, running_proxy

pytestmark = pytest.mark.server
API_KEY = "sk-realtime"
MODELS = ["omniasr_ctc", "qwen3_chat", "kokoro_tts"]
BUFFER_LIMIT = 200_000          # bytes: ~4 s of 24 kHz PCM16
MAX_TOKENS = 6                  # short answers: each sentence costs the tiny TTS seconds on a CPU
LONG_TOKENS = 600               # an answer long enough to be cancelled while it is written (and short
                                # enough that, whole, the next prompt still fits qwen3_chat's 2048 tokens)
TIMEOUT_S = 180
MAX_SESSIONS = 4                # the tests hold at most two at once


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("realtime"), MODELS) as s:
        yield s


@pytest.fixture(scope="module")
def proxy(server, tmp_path_factory):
    log = tmp_path_factory.mktemp("realtime_proxy") / "proxy.log"
    with running_proxy(server.grpc_url, log, "--api-key", API_KEY, "--realtime-max-buffer-bytes", str(BUFFER_LIMIT),
                       "--realtime-max-sessions", str(MAX_SESSIONS)) as url:
        yield url


@pytest.fixture(scope="module")
def speech(server) -> bytes:
    """Speech to send: the TTS model's own PCM (24 kHz, the session's default input rate)."""
    chunks = list(SpeechClient(server.grpc_url, timeout_s=TIMEOUT_S).stream("kokoro_tts", "Hello there."))
    assert chunks[0].sample_rate == 24000
    return b"".join(c.audio for c in chunks)


class Realtime:
    """A realtime session over a WebSocket."""

    def __init__(self, proxy: str, key: str | None = API_KEY, query: str = ""):
        headers = [f"Authorization: Bearer {key}"] if key else []
        self.ws = websocket.create_connection(proxy.replace("http://", "ws://") + "/v1/realtime" + query,
                                              header=headers, timeout=TIMEOUT_S)
        self.created = self.recv()
        assert self.created["type"] == "session.created"

    def send(self, **event) -> None:
        self.ws.send(json.dumps(event))

    def recv(self) -> dict:
        return json.loads(self.ws.recv())

    def until(self, *kinds: str) -> list[dict]:
        """Every event up to and including the first of one of `kinds`."""
        out = []
        while not out or out[-1]["type"] not in kinds:
            out.append(self.recv())
        return out

    def update(self, **session) -> dict:
        self.send(type="session.update", session=session)
        return self.until("session.updated", "error")[-1]

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def session(proxy):
    rt = Realtime(proxy)
    yield rt
    rt.close()


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def pcm_of(events: list[dict]) -> np.ndarray:
    return np.frombuffer(b"".join(base64.b64decode(e["delta"]) for e in of(events, "response.audio.delta")), "<i2")


def greedy_answer(server, messages: list[dict]) -> str:
    chunks = ChatClient(server.grpc_url, timeout_s=TIMEOUT_S).stream(
        "qwen3_chat", messages=messages, sampling={"temperature": 0.0, "max_tokens": MAX_TOKENS})
    return "".join(c.text for c in chunks)


def spoken_samples(server, text: str) -> list[int]:
    """How many 24 kHz samples the speech model makes for each sentence the cascade cuts `text` into."""
    s = Sentences()
    sentences = s.feed(text) + s.flush()
    client = SpeechClient(server.grpc_url, timeout_s=TIMEOUT_S)
    return [sum(len(c.audio) // 2 for c in client.stream("kokoro_tts", t)) for t in sentences]


def tone(rate: int, seconds: float = 1.0, hz: float = 440.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * hz * t) * 8000).astype("<i2").tobytes()


def append(rt: Realtime, pcm: bytes, pieces: int = 3) -> None:
    step = -(-len(pcm) // pieces // 2) * 2
    for i in range(0, len(pcm), step):
        rt.send(type="input_audio_buffer.append", audio=base64.b64encode(pcm[i:i + step]).decode())


def test_sentences_cut_at_ends_not_inside_numbers():
    s = Sentences()
    assert s.feed("Pi is 3.14 and") == []
    assert s.feed(" more. Is it?") == ["Pi is 3.14 and more. "]
    assert s.feed(" Yes\nNo") == ["Is it? ", "Yes\n"]
    assert s.flush() == ["No"] and s.flush() == []
    long = Sentences().feed("word " * 200)
    assert all(len(x) <= 400 for x in long) and "".join(long) == ("word " * 200)[:len("".join(long))]


def test_key_is_required(proxy):
    for key in (None, "sk-wrong"):
        with pytest.raises(websocket.WebSocketBadStatusException) as err:
            Realtime(proxy, key=key)
        assert err.value.status_code == 401
        assert json.loads(err.value.resp_body)["error"]["code"] == "invalid_api_key"
    # a browser cannot set headers: the key as a subprotocol, as OpenAI takes it
    ws = websocket.create_connection(proxy.replace("http://", "ws://") + "/v1/realtime", timeout=30,
                                     subprotocols=["realtime", f"openai-insecure-api-key.{API_KEY}"])
    assert json.loads(ws.recv())["type"] == "session.created" and ws.subprotocol == "realtime"
    ws.close()


def test_sessions_past_the_limit_are_refused_until_one_closes(proxy):
    open_ = [Realtime(proxy) for _ in range(MAX_SESSIONS)]
    with pytest.raises(websocket.WebSocketBadStatusException) as err:
        Realtime(proxy)
    assert err.value.status_code == 429
    assert json.loads(err.value.resp_body)["error"]["code"] == "too_many_sessions"
    open_.pop().close()
    deadline = time.monotonic() + 10
    while True:                 # the proxy sees the close a moment later
        try:
            open_.append(Realtime(proxy))
            break
        except websocket.WebSocketBadStatusException:
            assert time.monotonic() < deadline, "a closed session kept its place"
            time.sleep(0.2)
    for rt in open_:
        rt.close()


def test_session_names_the_cascade_models(session):
    s = session.created["session"]
    assert (s["model"], s["input_audio_transcription"]["model"], s["speech_model"]) == tuple(
        ["qwen3_chat", "omniasr_ctc", "kokoro_tts"])
    assert s["turn_detection"] is None and s["input_audio_sample_rate"] == s["output_audio_sample_rate"] == 24000
    updated = session.update(model="qwen3_chat", voice="am_adam", instructions="Be brief.",
                             input_audio_format={"type": "audio/pcm", "rate": 16000})
    assert updated["type"] == "session.updated", updated
    assert updated["session"]["voice"] == "am_adam" and updated["session"]["input_audio_sample_rate"] == 16000


def test_two_audio_turns(server, session, speech):
    """Turn 1: the TTS model's own speech at 24 kHz; turn 2: a 16 kHz tone, answered at 16 kHz. Each turn
    is transcribed, answered with the whole conversation and spoken sentence by sentence."""
    assert session.update(temperature=0, max_response_output_tokens=MAX_TOKENS)["type"] == "session.updated"
    asr = TranscribeClient(server.grpc_url, timeout_s=TIMEOUT_S)
    history = []
    for turn, (pcm, in_rate, out_rate) in enumerate([(speech, 24000, 24000), (tone(16000), 16000, 16000)]):
        if turn:
            fmt = {"type": "audio/pcm", "rate": in_rate}
            updated = session.update(input_audio_format=fmt, output_audio_format={"type": "audio/pcm",
                                                                                   "rate": out_rate})
            assert updated["session"]["output_audio_sample_rate"] == out_rate, updated
        append(session, pcm)
        session.send(type="input_audio_buffer.commit", event_id=f"commit{turn}")
        committed, created = session.recv(), session.recv()
        assert committed["type"] == "input_audio_buffer.committed"
        assert created["type"] == "conversation.item.created" and created["item"]["id"] == committed["item_id"]
        assert created["item"]["content"][0]["type"] == "input_audio"
        assert committed["previous_item_id"] == (history[-1]["id"] if history else None)
        before = step_counts(server, "kokoro_tts")[0]
        session.send(type="response.create")
        events = session.until("response.done")
        [heard] = of(events, "conversation.item.input_audio_transcription.completed")
        assert heard["item_id"] == committed["item_id"]
        assert heard["transcript"] == asr.transcribe("omniasr_ctc", wav_of(pcm, in_rate)).text.strip()
        assert heard["usage"] == {"type": "duration", "seconds": math.ceil(len(pcm) / 2 / in_rate)}
        history.append({"id": committed["item_id"], "role": "user", "content": heard["transcript"]})

        text = "".join(e["delta"] for e in of(events, "response.audio_transcript.delta"))
        assert text and not of(events, "response.text.delta")
        assert text == greedy_answer(server, [{"role": m["role"], "content": m["content"]} for m in history])
        [done_text] = of(events, "response.audio_transcript.done")
        assert done_text["transcript"] == text
        done = events[-1]["response"]
        assert done["status"] in ("completed", "incomplete") and done["output"][0]["content"][0]["transcript"] == text
        assert 0 < done["usage"]["output_tokens"] <= MAX_TOKENS and done["usage"]["input_tokens"] > 0
        if history[:-1]:        # the second turn's prompt holds the first turn
            assert done["usage"]["input_tokens"] > previous_usage["input_tokens"] + previous_usage["output_tokens"]
        previous_usage = done["usage"]
        history.append({"id": done["output"][0]["id"], "role": "assistant", "content": text})

        audio = pcm_of(events)
        spoken = step_counts(server, "kokoro_tts")[0] - before
        per_sentence = spoken_samples(server, text)
        assert spoken == len(per_sentence)          # one speech request per sentence, while the text streams
        expected = sum(per_sentence) * out_rate / 24000
        assert abs(audio.size - expected) <= 4 * len(per_sentence), (audio.size, expected)
        assert np.abs(audio.astype(np.int32)).max() > 0
        order = [e["type"] for e in events]
        assert order.index("response.created") < order.index("response.output_item.added") < order.index(
            "response.content_part.added") < order.index("response.audio.delta") < order.index(
            "response.audio.done") < order.index("response.output_item.done")


def test_text_turn_from_a_created_item(server, session):
    assert session.update(modalities=["text"], temperature=0, instructions="Answer in English.",
                          max_response_output_tokens=MAX_TOKENS)["type"] == "session.updated"
    session.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                       "content": [{"type": "input_text", "text": "Hi!"}]})
    created = session.recv()
    assert created["type"] == "conversation.item.created" and created["item"]["content"][0]["text"] == "Hi!"
    session.send(type="response.create")
    events = session.until("response.done")
    text = "".join(e["delta"] for e in of(events, "response.text.delta"))
    assert not of(events, "response.audio.delta") and not of(events, "response.audio_transcript.delta")
    assert text == greedy_answer(server, [{"role": "system", "content": "Answer in English."},
                                          {"role": "user", "content": "Hi!"}])
    assert of(events, "response.text.done")[0]["text"] == text
    assert 0 < events[-1]["response"]["usage"]["output_tokens"] <= MAX_TOKENS


def test_audio_item_is_transcribed_and_answered(server, session, speech):
    session.send(type="conversation.item.create", item={"role": "user", "content": [
        {"type": "input_audio", "audio": base64.b64encode(speech).decode()}]})
    created = session.recv()
    assert created["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    heard = session.until("conversation.item.input_audio_transcription.completed")[-1]
    direct = TranscribeClient(server.grpc_url, timeout_s=TIMEOUT_S).transcribe("omniasr_ctc", wav_of(speech, 24000))
    assert heard["item_id"] == created["item"]["id"] and heard["transcript"] == direct.text.strip()
    # an audio part with its transcript is taken as said, not transcribed again
    session.send(type="conversation.item.create", item={"role": "user", "content": [
        {"type": "input_audio", "transcript": "And you?"}]})
    assert session.recv()["item"]["content"] == [{"type": "input_audio", "transcript": "And you?"}]
    session.send(type="response.create", response={"modalities": ["text"], "temperature": 0,
                                                   "max_output_tokens": MAX_TOKENS})
    events = session.until("response.done")
    assert not of(events, "conversation.item.input_audio_transcription.completed")
    text = "".join(e["delta"] for e in of(events, "response.text.delta"))
    assert text == greedy_answer(server, [{"role": "user", "content": heard["transcript"]},
                                          {"role": "user", "content": "And you?"}])


def test_a_failed_transcription_says_why_and_the_turn_goes_on(session):
    assert session.update(input_audio_transcription={"model": "omniasr_ctc", "language": "12345"},
                          modalities=["text"], max_response_output_tokens=2)["type"] == "session.updated"
    append(session, tone(24000, 0.5))
    session.send(type="input_audio_buffer.commit")
    failed = session.until("conversation.item.input_audio_transcription.failed")[-1]
    assert failed["error"]["param"] == "session.input_audio_transcription.language", failed
    assert "12345" in failed["error"]["message"]
    session.send(type="response.create")        # answered all the same, the turn's text empty
    assert session.until("response.done")[-1]["response"]["status"] in ("completed", "incomplete")


def decode_steps(server) -> float:
    return metric(server, "triton_omni_ar_decode_steps", "qwen3_chat_ar")


def start_long_answer(server, rt: Realtime) -> tuple[list[dict], int]:
    """A response asked for LONG_TOKENS, read to its third text delta; and the speech requests before it."""
    assert rt.update(temperature=0, max_response_output_tokens=LONG_TOKENS)["type"] == "session.updated"
    rt.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Tell a story."}]})
    rt.until("conversation.item.created")
    spoken = step_counts(server, "kokoro_tts")[0]
    rt.send(type="response.create")
    events = []
    while len(of(events, "response.audio_transcript.delta")) < 3:
        events.append(rt.recv())
    return events, spoken


def assert_stopped(server, spoken_before: int) -> None:
    """Decoding stops within 5 s; at most the sentence being spoken reached the speech model."""
    deadline = time.monotonic() + 5
    while True:
        a = decode_steps(server)
        time.sleep(0.5)
        if decode_steps(server) == a:
            break
        assert time.monotonic() < deadline, "decoding went on after the response was cancelled"
    assert step_counts(server, "kokoro_tts")[0] - spoken_before <= 1


def test_cancel_mid_response_then_answer_again(server, session):
    events, spoken = start_long_answer(server, session)
    session.send(type="response.create", event_id="again")      # one response at a time
    session.send(type="response.cancel")
    events += session.until("response.done")
    [busy] = of(events, "error")
    assert busy["error"]["code"] == "conversation_already_has_active_response" and busy["error"]["event_id"] == "again"
    done = events[-1]["response"]
    assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
    # The tiny model may write its whole answer before the cancel lands (the front then sends it in a few
    # large pieces): then the cut is in the speech, whose sentences after the first were never sent.
    written = Sentences()
    written = written.feed("".join(e["delta"] for e in of(events, "response.audio_transcript.delta"))) + written.flush()
    assert done["usage"]["output_tokens"] < LONG_TOKENS or len(written) >= 3, (done["usage"], written)
    assert_stopped(server, spoken)
    # the session goes on: a new (short, text) response, the cancelled answer in its history
    session.send(type="response.create", response={"modalities": ["text"], "max_output_tokens": MAX_TOKENS})
    events = session.until("response.done")
    assert events[-1]["response"]["status"] in ("completed", "incomplete"), events[-1]["response"]
    assert 0 < events[-1]["response"]["usage"]["output_tokens"] <= MAX_TOKENS and of(events, "response.text.delta")


def test_closing_the_socket_stops_the_response(server, proxy):
    rt = Realtime(proxy)
    _, spoken = start_long_answer(server, rt)
    rt.close()
    assert_stopped(server, spoken)
    Realtime(proxy).close()        # the proxy still serves


def test_refused_voice_fails_the_response_and_a_cancel_at_once_ends_one(session):
    assert session.update(voice="nobody", temperature=0, max_response_output_tokens=MAX_TOKENS)["type"] == (
        "session.updated")
    session.send(type="conversation.item.create", item={"role": "user", "content": [{"type": "input_text",
                                                                                      "text": "Hi"}]})
    session.send(type="response.create")
    done = session.until("response.done")[-1]["response"]
    assert done["status"] == "failed" and done["status_details"]["error"]["param"] == "voice", done
    assert "nobody" in done["status_details"]["error"]["message"]
    # a response cancelled in the same breath as it is created still ends with its response.done
    session.send(type="response.create")
    session.send(type="response.cancel")
    events = session.until("response.done")
    assert events[0]["type"] == "response.created" and events[-1]["response"]["status"] == "cancelled"
    session.send(type="response.create", response={"modalities": ["text"], "max_output_tokens": 2})
    assert session.until("response.done")[-1]["response"]["status"] in ("completed", "incomplete")


BAD_EVENTS = [
    ("{not json", "invalid_json", None),
    ("[1, 2]", "invalid_event", None),
    # a lone surrogate (JSON lets one be escaped) would break every later prompt of the conversation
    ('{"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text", '
     '"text": "\\ud800 odd"}]}}', "invalid_value", "item.content[0].text"),
    ('{"type": "session.update", "session": {"instructions": "\\udfff"}}', "invalid_value", "session.instructions"),
    ({"type": "nope.nothing"}, "unknown_event_type", "type"),
    ({"event_id": "no-type"}, "unknown_event_type", "type"),
    ({"type": "response.create"}, "conversation_empty", None),        # nothing to answer yet
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty", None),
    ({"type": "response.cancel"}, "response_cancel_not_active", None),
    ({"type": "input_audio_buffer.append", "audio": "%%%"}, "invalid_value", "audio"),
    ({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}, "invalid_value", "audio"),
    ({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(BUFFER_LIMIT + 2)).decode()},
     "input_audio_buffer_too_large", "audio"),
    ({"type": "session.update", "session": {"colour": "red"}}, "unknown_parameter", "session.colour"),
    ({"type": "session.update", "session": {"model": "qwen3_5_chat"}}, "model_not_found", "session.model"),
    ({"type": "session.update", "session": {"speech_model": "qwen3_chat"}}, "model_not_found", "session.speech_model"),
    ({"type": "session.update", "session": {"turn_detection": {"type": "server_vad"}}}, "unsupported",
     "session.turn_detection"),
    ({"type": "session.update", "session": {"temperature": 9}}, "invalid_value", "session.temperature"),
    ({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}, "invalid_value",
     "session.input_audio_format"),
    ({"type": "conversation.item.create", "item": {"type": "function_call"}}, "unsupported", "item.type"),
    ({"type": "conversation.item.create", "item": {"role": "robot", "content": []}}, "invalid_value", "item.role"),
    ({"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text"}]}},
     "invalid_value", "item.content[0].text"),
    ({"type": "conversation.item.create", "previous_item_id": "item_missing",
      "item": {"role": "user", "content": [{"type": "input_text", "text": "x"}]}},
     "item_not_found", "previous_item_id"),
]


def test_bad_events_get_error_events_and_the_session_goes_on(server, session):
    for i, (event, code, param) in enumerate(BAD_EVENTS):
        if isinstance(event, dict):
            event = json.dumps({"event_id": f"bad{i}", **event})
        session.ws.send(event)
        error = session.until("error")[-1]["error"]
        assert (error["code"], error["param"]) == (code, param), (event[:120], error)
        assert error["type"] == "invalid_request_error" and error["message"]
        if '"event_id"' in event and "no-type" not in event:
            assert error["event_id"] == f"bad{i}"
    session.ws.send_binary(b"\x00\x01")
    assert session.until("error")[-1]["error"]["code"] == "invalid_event"
    # a refused append kept what the buffer had; a refused update changed nothing
    assert session.update()["session"] == {**session.created["session"]}
    session.send(type="input_audio_buffer.append", audio=base64.b64encode(tone(24000, 0.5)).decode())
    session.send(type="input_audio_buffer.clear")
    assert session.recv()["type"] == "input_audio_buffer.cleared"
    session.send(type="input_audio_buffer.commit")
    assert session.until("error")[-1]["error"]["code"] == "input_audio_buffer_commit_empty"
    # and it still answers
    session.send(type="conversation.item.create", item={"role": "user", "content": [{"type": "input_text",
                                                                                      "text": "Hello"}]})
    session.send(type="response.create", response={"modalities": ["text"], "max_output_tokens": 3})
    events = session.until("response.done")
    assert events[-1]["response"]["status"] in ("completed", "incomplete") and of(events, "response.text.delta")
