"""Faults on a live server: a killed stub, a model unloaded while its streams run, clients that vanish.

In each, the other model keeps serving, the failed one reports not ready and serves again after its
reload, and the engine's gauges (Triton's /metrics) show no decode slot or KV block left held.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from perf_analyzer_configs.reliability.run import idle_gauges
from triton_omni.client.chat import ChatClient
from triton_omni.client.speech import SpeechClient
from triton_omni.launcher.triton import group_processes
from triton_omni.launcher.watchdog import model_ready, stub_models
from tests.conftest import running_server

pytestmark = pytest.mark.server

MESSAGES = [{"role": "user", "content": "Hello"}]
LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}
SLOTS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("faults"), ["qwen3_chat", "kokoro_tts"],
                        [f"qwen3_chat.ar.max_num_seqs={SLOTS}"]) as s:
        yield s


def chat(server, **sampling) -> str:
    chunk = ChatClient(server.grpc_url, timeout_s=120).complete(
        "qwen3_chat", messages=MESSAGES, sampling={"max_tokens": 8, "temperature": 0, **sampling})
    assert chunk.finish_reason in ("length", "stop") and chunk.completion_tokens >= 1, chunk
    return chunk.text


def speech(server) -> bytes:
    audio = b"".join(c.audio for c in SpeechClient(server.grpc_url, timeout_s=120).stream("kokoro_tts", "Hello there."))
    assert len(audio) > 1000
    return audio


def assert_nothing_held(server) -> None:
    g = idle_gauges(server)
    assert g["running_seqs"] == 0 and g["waiting_seqs"] == 0, g
    assert g["free_slots"] == SLOTS and g["kv_blocks_used"] == 0, g


def test_bad_request_corpus_gets_answers_not_faults(server):
    """Every model and internal step of the server gets perf_analyzer_configs/reliability/corpus.py over
    gRPC and HTTP: no INTERNAL error, no hang, no stream left open, no stub died, and both models serve after."""
    from perf_analyzer_configs.reliability.run import GOOD, Tally, run_corpus

    tally = Tally()
    summary = run_corpus(server, tally, {m: GOOD[m] for m in ("qwen3_chat", "kokoro_tts")})
    assert not tally.faults, tally.faults[:10]
    assert summary["stub_deaths"] == 0 and summary["stubs_after"] == summary["stubs_before"], summary
    assert summary["served_after"] == {"qwen3_chat": True, "kokoro_tts": True}, summary
    tried = sum(sum(c.values()) for c in tally.rows.values())
    models = {m for m, _ in tally.rows}
    assert tried > 200 and {"qwen3_chat", "qwen3_chat_ar", "kokoro_tts_synth"} <= models, (tried, models)
    assert sum(c["INVALID_ARGUMENT"] for c in tally.rows.values()) > tried / 4   # refused by name, mostly


def test_clients_that_vanish_mid_stream_leave_no_slot_or_block_held(server):
    chat(server)
    def vanish(_):
        replies = ChatClient(server.grpc_url, timeout_s=120).stream("qwen3_chat", messages=MESSAGES, sampling=LONG)
        next(replies)
        next(replies)
        replies.close()                # cancels the stream after two chunks
    with ThreadPoolExecutor(SLOTS * 2) as pool:
        list(pool.map(vanish, range(SLOTS * 2)))
    assert_nothing_held(server)
    chat(server)


def test_a_killed_stub_turns_its_model_not_ready_and_a_reload_brings_it_back(server):
    text = chat(server)
    [pid] = [p for p, m in stub_models(group_processes(server.proc.pid)).items() if m == "qwen3_chat_ar"]
    os.kill(pid, signal.SIGKILL)           # what the kernel's out-of-memory killer does
    saw_not_ready, deadline = False, time.monotonic() + 120
    while time.monotonic() < deadline:
        ready = model_ready(server.http_url, "qwen3_chat_ar")
        saw_not_ready |= not ready
        if saw_not_ready and ready:
            break
        speech(server)                     # the other model serves throughout
        time.sleep(0.1)
    assert saw_not_ready and model_ready(server.http_url, "qwen3_chat_ar")
    [record] = [r for r in server.watchdog.recoveries if r.model == "qwen3_chat_ar"]
    assert record.error is None and record.ready_again_at is not None, record
    assert chat(server) == text            # the same answer from the fresh stub
    assert_nothing_held(server)


def test_a_model_unloaded_while_streams_run_ends_them_then_serves_after_load(server):
    results: list[object] = []

    def long_stream():
        try:
            chunks = list(ChatClient(server.grpc_url, timeout_s=120).stream("qwen3_chat", messages=MESSAGES,
                                                                            sampling=LONG))
            results.append(chunks[-1].finish_reason)
        except Exception as exc:  # noqa: BLE001
            results.append(exc)

    recoveries = len(server.watchdog.recoveries)
    threads = [threading.Thread(target=long_stream) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    post = lambda verb: urllib.request.urlopen(urllib.request.Request(  # noqa: E731
        f"http://{server.http_url}/v2/repository/models/qwen3_chat_ar/{verb}", data=b"{}", method="POST"), timeout=120)
    post("unload")
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a stream was left hanging by the unload"
    # Triton lets the running requests finish before it unloads (or they fail): each has an answer
    assert len(results) == 3 and all(r == "length" or isinstance(r, Exception) for r in results), results
    assert not model_ready(server.http_url, "qwen3_chat_ar")
    with pytest.raises(Exception):
        chat(server)
    speech(server)
    post("load")
    assert model_ready(server.http_url, "qwen3_chat_ar")
    assert len(server.watchdog.recoveries) == recoveries, "the watchdog took the unload for a crash"
    chat(server)
    assert_nothing_held(server)
