"""The OpenAI-compatible proxy in front of a live tritonserver serving the speech and image models,
driven by the official `openai` SDK; and perf_analyzer against both in CI-sized form.

Answers are checked against the same requests sent straight to Triton with the project's client.
"""
from __future__ import annotations

import base64
import io
import json
import subprocess
import sys

import av
import numpy as np
import openai
import pytest
from PIL import Image

from triton_omni.client.image import ImageClient
from triton_omni.client.speech import SpeechClient
from tests.conftest import ROOT, assert_int16_equal, running_server
from tests.test_openai_proxy import running_proxy

pytestmark = pytest.mark.server
SPEECH = {"seed": 5, "max_tokens": 60}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("media"), ["orpheus_tts", "z_image_turbo", "flux2_klein"]) as s:
        yield s


@pytest.fixture(scope="module")
def sdk(server, tmp_path_factory):
    with running_proxy(server.grpc_url, tmp_path_factory.mktemp("media_proxy") / "proxy.log") as url:
        client = openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=120)
        yield client
        client.close()


def test_models_lists_speech_and_image(sdk):
    assert {m.id for m in sdk.models.list()} == {"orpheus_tts", "z_image_turbo", "flux2_klein"}


def test_speech_to_a_file_equals_the_direct_call(server, sdk, tmp_path):
    out = tmp_path / "hello.wav"
    with sdk.audio.speech.with_streaming_response.create(model="orpheus_tts", voice="tara", input="Hello there.",
                                                         response_format="wav", extra_body=SPEECH) as resp:
        assert resp.headers["x-audio-sample-rate"] == "24000"
        resp.stream_to_file(out)
    direct = SpeechClient(server.grpc_url).synthesize("orpheus_tts", "Hello there.", voice="tara",
                                                      response_format="wav", sampling=SPEECH)
    assert out.read_bytes() == direct.audio                  # the proxy passes the server's bytes through
    with av.open(str(out)) as f:
        stream = f.streams.audio[0]
        samples = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(stream)])
    assert stream.sample_rate == 24000 and samples.size > 2048


def test_streamed_pcm_equals_the_file_samples(sdk):
    pcm = b""
    with sdk.audio.speech.with_streaming_response.create(model="orpheus_tts", voice="tara", input="Hello there.",
                                                         response_format="pcm", extra_body=SPEECH) as resp:
        for chunk in resp.iter_bytes():
            pcm += chunk
    wav = sdk.audio.speech.create(model="orpheus_tts", voice="tara", input="Hello there.", response_format="wav",
                                  extra_body=SPEECH).content
    with av.open(io.BytesIO(wav)) as f:
        samples = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)])
    streamed = np.frombuffer(pcm, dtype="<i2")
    assert streamed.shape == samples.shape and np.abs(streamed).max() > 0
    assert_int16_equal(streamed, samples)


def test_speech_errors_name_the_field(sdk):
    with pytest.raises(openai.BadRequestError) as err:
        sdk.audio.speech.create(model="orpheus_tts", voice="nobody", input="Hello.")
    assert "voice" in str(err.value)


def test_image_generation_equals_the_direct_call(server, sdk):
    extra = {"seed": 3, "num_inference_steps": 2}
    result = sdk.images.generate(model="z_image_turbo", prompt="a red square", size="64x48", n=2, extra_body=extra)
    images = [base64.b64decode(d.b64_json) for d in result.data]
    direct = ImageClient(server.grpc_url).generate("z_image_turbo", "a red square", size="64x48", n=2, **extra)
    assert images == direct
    for data in images:
        img = Image.open(io.BytesIO(data))
        assert img.format == "PNG" and img.size == (64, 48)


def test_image_errors_name_the_field(sdk):
    with pytest.raises(openai.BadRequestError) as err:
        sdk.images.generate(model="z_image_turbo", prompt="x", size="0x64")
    assert "size" in str(err.value)


@pytest.mark.parametrize("model,inputs", [
    ("orpheus_tts", ['sampling_parameters={"max_tokens": 28, "seed": 1}']),
    ("z_image_turbo", ["size=64x64", "num_inference_steps=2"]),
    ("flux2_klein", ["size=64x64", "num_inference_steps=2"]),
])
def test_perf_analyzer_measures_each_media_model(server, tmp_path, model, inputs):
    extra = [a for value in inputs for a in ("--input", value)]
    run = subprocess.run([sys.executable, "-m", "perf_analyzer_configs.runner.run", "--url", server.grpc_url, "--models", model,
                          "--concurrency", "1", "--measurement-ms", "4000", "--max-trials", "3", "--stability", "999",
                          "--timeout", "180", "--out", str(tmp_path), *extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads((tmp_path / "perf_analyzer.json").read_text())["rows"]
    assert [r["model"] for r in rows] == [model]
    assert rows[0]["throughput_per_s"] > 0 and rows[0]["p50_latency_us"] > 0
