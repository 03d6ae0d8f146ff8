"""Qwen3-Omni's thinker on a live tritonserver, over gRPC and through the OpenAI proxy (`input_audio` parts):
an audio + text question streams the text transformers' greedy `generate` writes on the tiny weights, four
requests sent together (one tower execution) answer as each alone, a text-only question works, and bad
audio is refused with INVALID_ARG naming the field while the server goes on serving."""
from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from triton_omni.client.chat import ChatClient
from triton_omni.client.tensors import make_inputs
from tests.asr_audio import encode_as
from tests.conftest import running_server, step_counts
from tests.test_omni_parity import audio_message, clips, processor_inputs
from tests.test_openai_proxy import running_proxy

pytestmark = pytest.mark.server
MODEL, AUDIO = "qwen3_omni", "qwen3_omni_audio"
TOKENS = 12
GREEDY = {"temperature": 0.0, "max_tokens": TOKENS}


@pytest.fixture(scope="module")
def folder():
    from tests.conftest import TINY
    from triton_omni.converters.tiny import build

    return build(TINY, ["qwen3_omni"])["qwen3_omni"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, folder):
    # the audio step waits up to 0.3 s for a batch: requests sent together share one tower execution
    overrides = [f"{MODEL}.audio.max_queue_delay_us=300000", f"{MODEL}.ar.max_num_seqs=8"]
    with running_server(tmp_path_factory.mktemp("omni"), [MODEL], overrides) as s:
        yield s


@pytest.fixture(scope="module")
def reference(folder):
    """transformers' greedy answer (text) to messages with clips, as the server hears the WAV files."""
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

    from triton_omni.media.audio import decode

    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(folder)).eval().thinker
    tok, fe = AutoTokenizer.from_pretrained(str(folder)), WhisperFeatureExtractor.from_pretrained(str(folder))
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]

    def answer(messages, wavs, prompt_tokens: bool = False):
        heard = [decode(w, 16000)[0] for w in wavs]
        inputs = processor_inputs((thinker, tok, fe), messages, heard)
        with torch.inference_mode():
            out = thinker.generate(**inputs, max_new_tokens=TOKENS, do_sample=False, eos_token_id=eos)
        text = tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        return (text, inputs["input_ids"].shape[1]) if prompt_tokens else text

    return answer


def wav(seed: int, which: int = 1) -> bytes:
    return encode_as(clips(seed)[which], 16000, "wav", "pcm_s16le")


def ask(server, messages, audios=(), sampling=GREEDY):
    chunks = list(ChatClient(server.grpc_url, timeout_s=120).stream(MODEL, messages=messages, sampling=sampling,
                                                                     audios=list(audios)))
    return "".join(c.text for c in chunks), chunks


def test_an_audio_question_streams_the_reference_answer(server, reference):
    data = wav(0)
    text, chunks = ask(server, audio_message(1), [data])
    want, prompt_tokens = reference(audio_message(1), [data], prompt_tokens=True)
    assert len(chunks) > 2 and text == want and text.strip()
    assert chunks[-1].prompt_tokens == prompt_tokens          # 1 s of audio: 13 placeholder tokens
    two = [wav(1, 0), wav(2, 2)]
    assert ask(server, audio_message(2, "Transcribe the audio."), two)[0] == \
        reference(audio_message(2, "Transcribe the audio."), two)


def test_a_text_question_gets_the_reference_answer(server, reference):
    messages = [{"role": "user", "content": "Describe the sound."}]
    assert ask(server, messages)[0] == reference(messages, [])


def test_four_requests_together_share_the_tower_and_answer_as_alone(server):
    clips_ = [wav(10 + i, i % 3) for i in range(4)]
    alone = [ask(server, audio_message(1), [c])[0] for c in clips_]
    assert len(set(alone)) > 1
    rounds = []
    for _ in range(3):              # dynamic batching is timing: on a loaded machine a round may split
        before = step_counts(server, AUDIO)
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda c: ask(server, audio_message(1), [c])[0], clips_))
        after = step_counts(server, AUDIO)
        rounds.append((after[0] - before[0], after[1] - before[1]))
        assert together == alone
        if rounds[-1][1] == 1:
            break
    assert rounds[-1] == (4, 1), f"(inferences, executions) of the audio step per round: {rounds}"


@pytest.mark.parametrize("parts, audios, field", [
    ([{"type": "audio"}], [b"not an audio file at all"], "audios[0]"),
    ([{"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}], [], "messages[0].content[0].input_audio.data"),
    ([{"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF....WAVEjunk").decode(), "format": "wav"}}],
     [], "messages[0].content[0].input_audio.data"),
    ([{"type": "audio"}], [], "messages[0].content[0]"),
    ([{"type": "text", "text": "hi"}], [b"x"], "audios"),
])
def test_bad_audio_is_refused_by_name_and_the_server_goes_on(server, parts, audios, field):
    messages = [{"role": "user", "content": parts}]
    with pytest.raises(InferenceServerException) as err:          # streamed: the stream ends with the error
        ask(server, messages, audios)
    assert f"field '{field}'" in err.value.message(), err.value.message()
    # called directly (no stream), the refusal is gRPC INVALID_ARGUMENT naming the field
    client = grpcclient.InferenceServerClient(server.grpc_url)
    values = {"messages": (messages, "BYTES"), "audios": (audios or None, "BYTES")}
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer(f"{MODEL}_pre", make_inputs(grpcclient, values), client_timeout=60)
    finally:
        client.close()
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and f"field '{field}'" in err.value.message()
    text, chunks = ask(server, audio_message(1), [wav(0)])         # and the server goes on serving
    assert chunks[-1].finish_reason and chunks[-1].completion_tokens > 0 and text


def test_openai_sdk_chat_with_input_audio(server, tmp_path_factory):
    data = wav(0)
    direct, _ = ask(server, audio_message(1), [data])
    parts = [{"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}},
             {"type": "text", "text": "What is said in this clip?"}]
    with running_proxy(server.grpc_url, tmp_path_factory.mktemp("omni_proxy") / "proxy.log") as url:
        sdk = openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=120)
        try:
            r = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}], temperature=0,
                                            max_tokens=TOKENS)
            assert r.choices[0].message.content == direct
            stream = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}],
                                                 temperature=0, max_tokens=TOKENS, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == direct
            with pytest.raises(openai.BadRequestError) as err:
                sdk.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
                    {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"junk").decode(), "format": "wav"}}]}])
            assert "audios[0]" in err.value.body["message"], err.value.body
        finally:
            sdk.close()


def test_bad_request_corpus_gets_answers_not_faults(server):
    """perf_analyzer_configs/reliability/corpus.py against the model and each of its steps over gRPC and HTTP
    (gRPC streams for the decoupled ones): no INTERNAL error, hang, open stream or dead stub; it serves after."""
    from perf_analyzer_configs.reliability.run import Tally, run_corpus

    good = {MODEL: lambda url: ChatClient(url, timeout_s=120).complete(
        MODEL, messages=audio_message(1), audios=[wav(0)], sampling=GREEDY).completion_tokens > 0}
    tally = Tally()
    summary = run_corpus(server, tally, good)
    assert not tally.faults, tally.faults[:10]
    assert summary["stub_deaths"] == 0 and summary["stubs_after"] == summary["stubs_before"], summary
    assert summary["served_after"] == {MODEL: True}, summary
    models = {m for m, _ in tally.rows}
    assert {MODEL, f"{MODEL}_pre", AUDIO, f"{MODEL}_ar"} <= models, models
    tried = sum(sum(c.values()) for c in tally.rows.values())
    assert tried > 100 and sum(c["INVALID_ARGUMENT"] for c in tally.rows.values()) > tried / 4, tally.rows


def test_the_cli_asks_about_an_audio_file(server, tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    path = tmp_path / "question.wav"
    path.write_bytes(wav(0))
    run = subprocess.run([sys.executable, "-m", "triton_omni.client", "chat", "--model", MODEL, "--audio", str(path),
                          "What is said in this clip?", "--max-tokens", str(TOKENS), "--temperature", "0",
                          "--url", server.grpc_url], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip("\n") == ask(server, audio_message(1), [wav(0)])[0]
