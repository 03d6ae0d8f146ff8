"""Orpheus TTS on a live tritonserver: streamed PCM chunks, files in every format, batching,
cancellation, bad input. Inputs and outputs follow the OpenAI `speech` route's tensor contract.

The weights are tiny and random (the audio is noise), so the checks are about the serving path:
the streamed chunks concatenate to exactly the non-streamed audio for the same seed, files decode
back at the rate the response states, bad requests fail alone and the server keeps serving.
"""
from __future__ import annotations

import queue
import re
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_omni.client.tensors import make_inputs
from triton_omni.media import audio
from tests.conftest import assert_int16_equal, rounds_until_batched, running_server, wav_pcm16

pytestmark = pytest.mark.server

MODEL = "orpheus_tts"
FRAME_BYTES = 2048 * 2            # one SNAC frame of s16 samples
DTYPES = {"stream": "BOOL", "speed": "FP32"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    # a 20 ms codec queue delay: on a loaded 2-core machine concurrent streams' chunks arrived more
    # than the ensemble's 500 us apart and never shared an execution (the batching test failed)
    overrides = [f"{MODEL}.max_model_len=512", f"{MODEL}.codec.max_queue_delay_us=20000"]
    with running_server(tmp_path_factory.mktemp("tts"), [MODEL], overrides) as s:
        yield s


class SpeechError(Exception):
    pass


def speak(server, text="Hello there.", sampling=None, timeout=60, **values) -> list[tuple[bytes, int, str]]:
    """One request over a gRPC stream: [(audio, sample_rate, finish_reason)] per response."""
    tensors = {"text": (text, "BYTES"), "sampling_parameters": (sampling, "BYTES")}
    tensors.update({k: (v, DTYPES.get(k, "BYTES")) for k, v in values.items()})
    return stream_speech(server, MODEL, tensors, timeout)


def fails_beside(bad, good, timeout: float = 120):
    """Call `bad()`, which must fail with SpeechError, while `good()` runs in another thread (the two
    requests are in flight together); return (the error's text, what good() returned)."""
    with ThreadPoolExecutor(1) as pool:
        neighbour = pool.submit(good)
        with pytest.raises(SpeechError) as err:
            bad()
        return str(err.value), neighbour.result(timeout=timeout)


def stream_speech(server, model: str, tensors: dict, timeout: float) -> list[tuple[bytes, int, str]]:
    """Send one speech request to `model` over a gRPC stream and collect its responses until the one
    with a finish_reason; a stream error raises SpeechError (shared with the other speech models' tests)."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    out = []
    try:
        client.async_stream_infer(model, make_inputs(grpcclient, tensors), request_id=uuid.uuid4().hex)
        while True:
            result, error = results.get(timeout=timeout)
            if error is not None:
                raise SpeechError(error.message())
            reason = result.as_numpy("finish_reason")[0, 0].decode()
            out.append((result.as_numpy("audio")[0, 0], int(result.as_numpy("sample_rate")[0, 0]), reason))
            if reason:
                return out
    finally:
        client.stop_stream()
        client.close()


def seeded(seed=3, frames=20, **extra):
    return {"seed": seed, "max_tokens": 7 * frames, "ignore_eos": True, **extra}


def metric(server, name: str, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    m = re.search(rf'^{name}{{model="{model}"}} ([0-9.e+]+)$', text, re.M)
    assert m, f"{name} for {model} not in /metrics"
    return float(m.group(1))


def test_streamed_chunks_equal_the_non_streamed_audio(server):
    chunks = speak(server, sampling=seeded(), stream=True, voice="tara")
    # 20 frames: a small first chunk (2 frames), one of 8, then the rest at the end
    assert [len(a) // FRAME_BYTES for a, _, _ in chunks] == [2, 8, 10]
    assert [r for _, _, r in chunks] == ["", "", "length"] and {s for _, s, _ in chunks} == {24000}
    streamed = b"".join(a for a, _, _ in chunks)
    (pcm, rate, reason), = speak(server, sampling=seeded(), stream=False, voice="tara", response_format="pcm")
    assert (rate, reason) == (24000, "length")
    assert len(pcm) == len(streamed)
    assert_int16_equal(pcm, streamed)
    samples = np.frombuffer(pcm, "<i2")
    assert np.abs(samples).max() > 1000                 # not silence
    (wav, _, _), = speak(server, sampling=seeded(), voice="tara", response_format="wav")
    back, wav_rate = wav_pcm16(wav)
    assert wav_rate == 24000 and np.array_equal(back, samples)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac"])
def test_files_decode_at_the_stated_rate(server, fmt):
    (data, rate, reason), = speak(server, sampling=seeded(frames=12), response_format=fmt)
    back, decoded_rate = audio.decode(data)
    assert decoded_rate == rate == (48000 if fmt == "opus" else 24000)
    assert abs(len(back) / rate - 12 * 2048 / 24000) < 0.08 and reason == "length"


def test_seed_decides_the_audio(server):
    a = speak(server, sampling=seeded(seed=5, frames=8), response_format="pcm")[0][0]
    b = speak(server, sampling=seeded(seed=5, frames=8), response_format="pcm")[0][0]
    c = speak(server, sampling=seeded(seed=6, frames=8), response_format="pcm")[0][0]
    assert a == b and a != c


def test_concurrent_streams_are_batched_and_equal_one_by_one(server):
    texts = ["Hello there.", "The quick brown fox", "pack my box", "Numbers 0123", "Write a haiku", "café"]

    def say(i: int) -> list:
        return speak(server, texts[i], seeded(i, 14), stream=True)

    alone = [say(i) for i in range(len(texts))]

    def together() -> list:
        with ThreadPoolExecutor(len(texts)) as pool:
            return list(pool.map(say, range(len(texts))))

    rounds = rounds_until_batched(server, f"{MODEL}_codec", together)
    for chunks, inferences, executions in rounds:
        assert chunks == alone
        assert inferences == sum(len(c) for c in chunks)      # the codec ran once per talker response
    # ... and several requests' chunks shared an execution
    assert rounds[-1][2] < rounds[-1][1], rounds[-1][1:]


def test_cancelled_stream_stops_decoding(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = make_inputs(grpcclient, {"text": ("Tell me a story", "BYTES"), "stream": (True, "BOOL"),
                                      "sampling_parameters": ({"max_tokens": 480, "ignore_eos": True}, "BYTES")})
    client.async_stream_infer(MODEL, inputs, request_id=uuid.uuid4().hex)
    result, error = results.get(timeout=60)             # the first chunk: decoding is under way
    assert error is None and result.as_numpy("finish_reason")[0, 0] == b""
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 10
    while True:
        a = metric(server, "triton_omni_ar_decode_steps", f"{MODEL}_talker")
        time.sleep(0.5)
        if metric(server, "triton_omni_ar_decode_steps", f"{MODEL}_talker") == a:
            break
        assert time.monotonic() < deadline, "decoding went on after the stream was cancelled"
    assert speak(server, sampling=seeded(frames=6), response_format="pcm")[0][2] == "length"


BAD = [
    ("empty text", {"text": ""}, "field 'text': is empty"),
    ("unknown voice", {"voice": "alloy"}, "field 'voice': unknown voice 'alloy'"),
    ("text too long", {"text": "pack my box " * 100}, "field 'text': is too long"),
    ("text far too long", {"text": "x" * 5000}, "field 'text': is too long: 5000 characters"),
    ("bad response_format", {"response_format": "aiff"}, "field 'response_format'"),
    ("speed", {"speed": 2.0}, "field 'speed'"),
    ("reference audio", {"reference_audio": "RIFF0000WAVE"}, "field 'reference_audio'"),
    ("sampling not JSON", {"sampling": "{oops"}, "field 'sampling_parameters': not valid JSON"),
    ("max_tokens above context", {"sampling": {"max_tokens": 5000}}, "field 'sampling_parameters.max_tokens'"),
    ("instructions", {"instructions": "whisper"}, "field 'instructions': this model takes no instructions"),
    ("language", {"language": "english"}, "field 'language': this model takes no language choice"),
]


@pytest.mark.parametrize("case,values,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_input_fails_that_request_only(server, case, values, expect):
    error, chunks = fails_beside(lambda: speak(server, **{"text": "Hi.", **values}),
                                 lambda: speak(server, "Hello there.", seeded(frames=8), stream=True))
    assert expect in error, error
    assert chunks[-1][2] == "length" and sum(len(a) for a, _, _ in chunks) == 8 * FRAME_BYTES


def test_bad_input_is_http_400(server):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer(f"{MODEL}_pre", make_inputs(httpclient, {"text": ("hi", "BYTES"), "voice": ("bob", "BYTES")}))
        assert err.value.status() == "400" and "field 'voice'" in err.value.message()
    finally:
        client.close()
