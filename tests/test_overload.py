"""Overload: 4x a model's queue bound at once is answered, never left hanging.

A chat model's AR engine queues at most `max_waiting_seqs` prompts (ar/config.py) beside the
`max_num_seqs` it decodes; an image model's denoise step has Triton's queue policy
(`batching.max_queue_size`, converters/schema.py). Past either bound a request is refused at once
with UNAVAILABLE (the proxy: 429 with Retry-After); every accepted one completes; no stream is left
open; afterwards the model serves as before. Bounded and loopback only: a few dozen requests.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from triton_omni.client.chat import ChatClient
from triton_omni.client.image import ImageClient
from tests.conftest import running_server
from tests.test_openai_proxy import running_proxy

pytestmark = pytest.mark.server

RUNNING, WAITING = 2, 2                           # the chat engine's bounds here: 4 requests in all
IMAGE_QUEUE = 2
LONG = {"max_tokens": 64, "ignore_eos": True, "temperature": 0}
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
IMAGE = {"prompt": "a cat", "size": "64x64", "num_inference_steps": 8}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    overrides = [f"qwen3_chat.ar.max_num_seqs={RUNNING}", f"qwen3_chat.ar.max_waiting_seqs={WAITING}",
                 "qwen3_chat.ar.cuda_graph_batch_sizes=[1, 2]",
                 f"z_image_turbo.denoise.max_queue_size={IMAGE_QUEUE}"]
    with running_server(tmp_path_factory.mktemp("overload"), ["qwen3_chat", "z_image_turbo"], overrides) as s:
        yield s


def chat_outcome(url: str, start: threading.Event) -> tuple[str, float, str]:
    """('ok' | 'refused' | 'error', seconds to the answer or the refusal, detail)."""
    start.wait()
    t0 = time.perf_counter()
    try:
        chunks = list(ChatClient(url, timeout_s=120).stream("qwen3_chat", messages=MESSAGES, sampling=LONG))
        ok = chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == LONG["max_tokens"]
        return ("ok" if ok else "error"), time.perf_counter() - t0, repr(chunks[-1])
    except Exception as exc:  # noqa: BLE001 - sorted by its message below
        kind = "refused" if "retry later" in str(exc) else "error"
        return kind, time.perf_counter() - t0, str(exc)[:300]


def burst(fn, n: int):
    start = threading.Event()
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(fn, start) for _ in range(n)]
        start.set()
        return [f.result(timeout=300) for f in futures]      # a hung request fails the test here


def test_chat_at_4x_capacity_refuses_at_once_and_completes_the_rest(server):
    outcomes = burst(lambda start: chat_outcome(server.grpc_url, start), 4 * (RUNNING + WAITING))
    kinds = [k for k, _, _ in outcomes]
    assert "error" not in kinds, [o for o in outcomes if o[0] == "error"]
    assert kinds.count("ok") >= RUNNING + WAITING and kinds.count("refused") >= 1, kinds
    refused = [t for k, t, _ in outcomes if k == "refused"]
    slowest_ok = max(t for k, t, _ in outcomes if k == "ok")
    assert max(refused) < 5.0 and max(refused) < slowest_ok, (refused, slowest_ok)   # at once, not after a wait
    detail = next(d for k, _, d in outcomes if k == "refused")
    assert "max_waiting_seqs" in detail, detail
    # full service afterwards: the slots and the queue are free again
    again = burst(lambda start: chat_outcome(server.grpc_url, start), RUNNING + WAITING)
    assert [k for k, _, _ in again] == ["ok"] * (RUNNING + WAITING), again


def image_outcome(url: str, start: threading.Event) -> tuple[str, float, str]:
    start.wait()
    t0 = time.perf_counter()
    try:
        [png] = ImageClient(url, timeout_s=120).generate("z_image_turbo", **IMAGE)
        return ("ok" if png.startswith(b"\x89PNG") else "error"), time.perf_counter() - t0, ""
    except Exception as exc:  # noqa: BLE001
        kind = "refused" if "Exceeds maximum queue size" in str(exc) else "error"
        return kind, time.perf_counter() - t0, str(exc)[:300]


def test_image_past_the_queue_policy_is_refused_and_serves_after(server):
    n = 4 * (8 + IMAGE_QUEUE)                          # 4x what one batch (max_batch_size 8) and the queue hold
    outcomes = burst(lambda start: image_outcome(server.grpc_url, start), n)
    kinds = [k for k, _, _ in outcomes]
    assert "error" not in kinds, [o for o in outcomes if o[0] == "error"]
    assert kinds.count("refused") >= 1 and kinds.count("ok") >= IMAGE_QUEUE, kinds
    assert image_outcome(server.grpc_url, _set())[0] == "ok"


def _set() -> threading.Event:
    e = threading.Event()
    e.set()
    return e


def test_proxy_answers_429_with_retry_after_and_then_serves(server, tmp_path):
    body = json.dumps({"model": "qwen3_chat", "messages": MESSAGES, "max_tokens": LONG["max_tokens"],
                       "temperature": 0, "stream": True, "ignore_eos": True}).encode()

    def call(url: str, start: threading.Event) -> tuple[int, str | None, float]:
        start.wait()
        t0 = time.perf_counter()
        req = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                text = r.read().decode()
                # a stream refused after it opened would end with an error event instead of [DONE]
                return (r.status if text.rstrip().endswith("data: [DONE]") else 599), None, time.perf_counter() - t0
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Retry-After"), time.perf_counter() - t0

    with running_proxy(server.grpc_url, tmp_path / "proxy.log") as url:
        outcomes = burst(lambda start: call(url, start), 4 * (RUNNING + WAITING))
        codes = sorted(c for c, _, _ in outcomes)
        assert set(codes) <= {200, 429} and codes.count(200) >= RUNNING + WAITING and 429 in codes, codes
        assert all(after == "1" for c, after, _ in outcomes if c == 429), outcomes
        assert call(url, _set())[0] == 200
