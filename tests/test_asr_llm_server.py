"""qwen3_asr on a live tritonserver with real speech (espeak-ng), through Triton's gRPC and through the OpenAI
proxy with the `openai` SDK: a few formats, requests of different lengths in one encoder execution, the
decoder streaming token by token (per-token `transcript.text.delta` events, the first before the
rest), the language given or detected, bad input refused by field with its neighbours unaffected.

Transcripts are checked against transformers' Qwen3ASRForConditionalGeneration.generate (greedy) on the
audio PyAV decodes from the same file: the tiny model's weights are random, so each file is checked
against its own reference. The decoder is capped at a few tokens a segment (max_new_tokens) to keep the
CPU run short.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import openai
import pytest
import torch
from tritonclient.utils import InferenceServerException

from triton_omni.client.transcribe import TranscribeClient
from triton_omni.media import audio
from tests.asr_audio import encode_as, espeak_wav
from tests.conftest import rounds_until_batched, running_server
from tests.test_openai_proxy import running_proxy

pytestmark = pytest.mark.server
MODEL = "qwen3_asr"
RATE = 16000
TOKENS = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("asr_llm"), [MODEL], [f"{MODEL}.pre.max_new_tokens={TOKENS}"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return TranscribeClient(server.grpc_url, timeout_s=300)


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    """transformers' greedy transcript of a 16 kHz clip of at most 30 s (one segment: the whole clip)."""
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    folder = str(tiny_checkpoints[MODEL])
    model = Qwen3ASRForConditionalGeneration.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)

    def transcript(wave: np.ndarray, language: str | None = "en", prompt: str | None = None) -> tuple[str, list[int]]:
        inputs = processor.apply_transcription_request(wave, language=language, prompt=prompt)
        with torch.inference_mode():
            ids = model.generate(**inputs, max_new_tokens=TOKENS, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        return processor.decode(ids, skip_special_tokens=True).lstrip(), ids.tolist()
    return transcript


@pytest.fixture(scope="module")
def speech():
    return {"sentence": espeak_wav(), "short": espeak_wav("Good morning."),
            "long": espeak_wav("The quick brown fox jumps over the lazy dog, and she sells sea shells by the sea shore.")}


def test_formats_give_the_reference_transcript(client, reference, speech):
    wave, own_rate = audio.decode(speech["sentence"])
    files = {"wav": speech["sentence"], "mp3": encode_as(wave, own_rate, "mp3", "libmp3lame", 2, 44100),
             "opus": encode_as(wave, own_rate, "ogg", "libopus", 1, 48000)}
    for name, data in files.items():
        result = client.transcribe(MODEL, data, language="en")
        want, _ = reference(audio.decode(data, RATE)[0])
        assert result.text == want, name
        assert result.language == "en" and len(result.segments) == 1 and result.segments[0]["text"] == want.strip()
        assert abs(result.duration - wave.size / own_rate) < 0.1, name


def test_prompt_and_detected_language(client, reference, speech, tiny_checkpoints):
    """A prompt is the system turn's context; without a language the model's "language X<asr_text>" header
    is its detection, never text (random weights: the reference says whether it wrote the marker)."""
    from triton_omni.text.tokenizer import load_tokenizer

    wave = audio.decode(speech["short"], RATE)[0]
    assert client.transcribe(MODEL, speech["short"], language="en", prompt="Names: Ada, Grace.").text == \
        reference(wave, prompt="Names: Ada, Grace.")[0]
    _, ids = reference(wave, language=None)
    result = client.transcribe(MODEL, speech["short"])
    tok = load_tokenizer(tiny_checkpoints[MODEL])
    marker = tok.convert_tokens_to_ids("<asr_text>")
    text_ids = ids[ids.index(marker) + 1:] if marker in ids else []
    assert result.text == tok.decode(text_ids, skip_special_tokens=True).lstrip()


def transcribe_together(client, clips: list[bytes], **options):
    out: list = [None] * len(clips)

    def one(i):
        try:
            out[i] = client.transcribe(MODEL, clips[i], language="en", **options)
        except InferenceServerException as e:
            out[i] = e
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clips))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_requests_of_different_lengths_share_one_encoder_execution(server, client, speech):
    clips = [speech["short"], speech["sentence"], speech["long"]]
    alone = [client.transcribe(MODEL, c, language="en").text for c in clips]
    rounds = rounds_until_batched(server, f"{MODEL}_encoder", lambda: transcribe_together(client, clips))
    for results, _, _ in rounds:
        assert [r.text for r in results] == alone
    _, inferences, executions = rounds[-1]
    assert executions < inferences, f"{inferences} requests in {executions} encoder executions"


def test_bad_input_fails_alone(client, speech):
    good = client.transcribe(MODEL, speech["short"], language="en").text
    bad = [b"This is a text file, not audio.", b""]
    results = transcribe_together(client, [speech["short"], *bad, speech["short"]])
    assert results[0].text == good == results[-1].text
    for got in results[1:-1]:
        assert isinstance(got, InferenceServerException) and "field 'audio'" in got.message()
    for options, field in [({"language": "tlh"}, "language"), ({"words": True}, "timestamp_granularities"),
                           ({"temperature": 2.0}, "temperature")]:
        with pytest.raises(InferenceServerException, match=f"field '{field}'"):
            client.transcribe(MODEL, speech["short"], **options)


def test_sampled_transcripts_vary_with_temperature(client, speech):
    texts = {client.transcribe(MODEL, speech["short"], language="en", temperature=1.0).text for _ in range(3)}
    assert all(isinstance(t, str) for t in texts) and len(texts) >= 2


# -- the OpenAI proxy -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sdk(server, tmp_path_factory):
    with running_proxy(server.grpc_url, tmp_path_factory.mktemp("asr_llm_proxy") / "proxy.log") as url:
        yield openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=120)


def test_sdk_transcription_streamed_token_by_token(sdk, client, speech):
    direct = client.transcribe(MODEL, speech["long"], language="en").text
    body = sdk.audio.transcriptions.create(model=MODEL, file=("long.wav", speech["long"], "audio/wav"), language="en")
    assert body.text == direct
    t0 = time.perf_counter()
    stamps, events = [], []
    for e in sdk.audio.transcriptions.create(model=MODEL, file=("long.wav", speech["long"], "audio/wav"),
                                             language="en", stream=True):
        stamps.append(time.perf_counter() - t0)
        events.append(e)
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == direct
    assert len(events) - 1 >= min(3, len(direct.split())), "the decoder streams: several deltas"
    print(f"time to first delta {1e3 * stamps[0]:.0f} ms, to done {1e3 * stamps[-1]:.0f} ms")
    assert stamps[0] < stamps[-1]


def test_sdk_errors_name_the_field(sdk, speech):
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.transcriptions.create(model=MODEL, file=("x.wav", b"not audio at all", "audio/wav"))
    assert e.value.body["param"] == "file"
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.translations.create(model=MODEL, file=("p.wav", speech["short"], "audio/wav"))
    assert e.value.body["param"] == "model" and "does not translate" in e.value.body["message"]


def test_long_audio_in_segments_in_order(client, sdk, speech):
    """Two sentences 32 s apart: two segments (the silence between them is never encoded), each its own
    sequence on the engine; the streamed pieces join to the text without streaming, segment by segment."""
    first, _ = audio.decode(speech["short"], RATE)
    second, _ = audio.decode(speech["sentence"], RATE)
    wave = np.concatenate([first, np.zeros(32 * RATE, np.float32), second])
    data = audio.encode(wave, RATE, "wav")
    result = client.transcribe(MODEL, data, language="en")
    assert len(result.segments) == 2 and result.segments[0]["end"] < 5 < 32 < result.segments[1]["start"]
    assert result.text == " ".join(s["text"] for s in result.segments if s["text"])
    streamed = "".join(client.stream(MODEL, data, language="en"))
    assert streamed == result.text


def test_internal_steps_refuse_bad_tensors_by_name(server, client, speech):
    """The encoder, the decoder and the post step called directly (as any step can be) with tensors the
    steps before them never make."""
    from triton_omni.client.triton import responses

    spans = lambda rows: (np.asarray(rows, np.int64).reshape(-1, 4), "INT64")     # noqa: E731
    one = spans([[0, 16000, 0, 16000]])
    options = ('{"duration": 1.0}', "BYTES")
    ids = lambda v: (np.asarray(v, np.int32), "INT32")                            # noqa: E731
    rows = lambda n: (np.zeros((n, 64), np.float32), "FP32")                      # noqa: E731
    cases = [
        (f"{MODEL}_encoder", {"samples": (np.zeros(16000, np.float32), "FP32"), "segment_spans": spans([[0, 8000, 0, 8000]])},
         "segment_spans", "add up to 8000"),
        (f"{MODEL}_ar", {"input_ids": ids([1, 2, 3]), "prompt_lens": ids([2]), "segment_spans": one,
                         "transcription": options}, "prompt_lens", "add up to"),
        (f"{MODEL}_ar", {"input_ids": ids([1, 5, 5, 3]), "prompt_lens": ids([4]), "prompt_embeds": rows(3),
                         "segment_spans": one, "transcription": options}, "prompt_embeds", "expected [2, hidden]"),
        (f"{MODEL}_ar", {"input_ids": ids([1, 10**6]), "prompt_lens": ids([2]), "segment_spans": one,
                         "transcription": options}, "input_ids", "token ids must be in"),
        (f"{MODEL}_ar", {"input_ids": ids([1, 2]), "prompt_lens": ids([2]), "segment_spans": spans([[0, 1, 0, 1]] * 2),
                         "transcription": options}, "segment_spans", "2 segments for 1 prompts"),
        (f"{MODEL}_post", {"token_ids": ids([]), "num_context": ids([0]), "new_segment": (np.array([False]), "BOOL"),
                           "first_text": (np.array([False]), "BOOL"), "streamed": (np.array([False]), "BOOL"),
                           "finish_reason": ("stop", "BYTES"), "segment_token_ids": ids([1, 2]),
                           "segment_token_counts": ids([5]), "segment_headers": ('[""]', "BYTES"), "segment_spans": one,
                           "transcription": options}, "segment_token_counts", "adding up to 5"),
    ]
    for model, values, field, message in cases:
        with pytest.raises(InferenceServerException) as e:
            list(responses(server.grpc_url, model, values, 60))
        assert f"field '{field}'" in e.value.message() and message in e.value.message(), (model, e.value.message())
    assert client.transcribe(MODEL, speech["short"], language="en").text is not None      # the steps serve on
