"""omniasr_ctc on a live tritonserver with real speech (espeak-ng), through Triton's gRPC and through the
OpenAI proxy with the `openai` SDK: every audio format, requests of different lengths in one encoder
execution, ten minutes of audio in segments, bad audio refused alone, each response_format, streaming.

Transcripts are checked against transformers' OmniASRForCTC on the audio PyAV decodes from the same
file (the tiny model's weights are random: its transcript is not the sentence, and a lossy codec
changes it, so each file is checked against its own reference; the lossless files decode to the same
samples and give the same transcript).
"""
from __future__ import annotations

import json
import threading

import numpy as np
import openai
import pytest
import torch
from tritonclient.utils import InferenceServerException

from triton_omni.client.cli import main as cli_main
from triton_omni.client.transcribe import TranscribeClient
from triton_omni.media import audio
from tests.asr_audio import FORMATS, encode_as, espeak_wav
from tests.conftest import rounds_until_batched, running_server
from tests.test_openai_proxy import running_proxy

pytestmark = pytest.mark.server
MODEL = "omniasr_ctc"
RATE = 16000


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("asr"), [MODEL]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return TranscribeClient(server.grpc_url, timeout_s=300)


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    """transformers' model and processor: the transcript of a 16 kHz clip, as the served pipeline makes it
    for a clip of at most 30 s with speech in it (one segment, the whole clip)."""
    from transformers import AutoProcessor, OmniASRForCTC

    folder = str(tiny_checkpoints[MODEL])
    model, processor = OmniASRForCTC.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)

    def transcript(wave: np.ndarray) -> str:
        with torch.inference_mode():
            ids = model.generate(**processor.feature_extractor(wave, sampling_rate=RATE))[0]
        return processor.decode(ids, skip_special_tokens=True).strip()
    return transcript


@pytest.fixture(scope="module")
def speech():
    """espeak-ng's WAV (22,050 Hz) of the sentence, and of a shorter and a longer one."""
    return {"sentence": espeak_wav(), "short": espeak_wav("Good morning."),
            "long": espeak_wav("The quick brown fox jumps over the lazy dog, and she sells sea shells by the sea "
                               "shore, one two three four five six seven eight nine ten.")}


def test_every_format_gives_the_reference_transcript(client, reference, speech):
    wav = speech["sentence"]
    wave, own_rate = audio.decode(wav)
    files = {name: encode_as(wave, own_rate, *spec) for name, spec in FORMATS.items()}
    files["wav"] = wav                                    # espeak-ng's own file (22,050 Hz mono)
    files["flac"] = encode_as(wave, own_rate, "flac", "flac")       # the same samples, lossless
    got = {}
    for name, data in files.items():
        result = client.transcribe(MODEL, data)
        got[name] = result.text
        assert result.text == reference(audio.decode(data, RATE)[0]), name
        assert abs(result.duration - wave.size / own_rate) < 0.1, name
        assert result.segments and result.segments[-1]["end"] <= result.duration + 0.05
    assert got["wav"] == got["flac"] and got["wav"]


def send_together(client, clips: list[bytes]):
    out: list = [None] * len(clips)

    def one(i):
        try:
            out[i] = client.transcribe(MODEL, clips[i])
        except InferenceServerException as e:
            out[i] = e
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clips))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_requests_of_different_lengths_share_one_encoder_execution(server, client, speech):
    clips = [speech["short"], speech["sentence"], speech["long"], speech["sentence"] + b""]
    alone = [client.transcribe(MODEL, c).text for c in clips]
    rounds = rounds_until_batched(server, f"{MODEL}_encoder", lambda: send_together(client, clips))
    for results, _, _ in rounds:
        assert [r.text for r in results] == alone
    _, inferences, executions = rounds[-1]
    assert executions < inferences, f"{inferences} requests in {executions} encoder executions"


def test_ten_minutes_in_segments(client, speech):
    """A sentence every 20 s, and 45 s of sentences without a gap: one segment per lone sentence (the
    silence is never encoded), the 48 s of speech from 297 s on in segments of at most 30 s."""
    burst, _ = audio.decode(speech["sentence"], RATE)
    pattern = np.concatenate([np.zeros(20 * RATE - burst.size, np.float32), burst])
    wave = np.tile(pattern, 30)
    wave[300 * RATE:345 * RATE] = np.tile(burst, 45 * RATE // burst.size + 1)[:45 * RATE]
    result = client.transcribe(MODEL, audio.encode(wave, RATE, "wav"))
    assert abs(result.duration - 600) < 0.01 and result.text
    starts = [s["start"] for s in result.segments]
    assert starts == sorted(starts) and 28 <= len(result.segments) <= 32
    assert all(0 <= s["start"] < s["end"] <= 600 and s["end"] - s["start"] <= 30 for s in result.segments)
    # every segment begins within speech (VAD padding aside), and the long stretch has two or more
    speaking = np.convolve(np.abs(wave) > 1e-3, np.ones(RATE // 5), "same") > 0
    assert all(speaking[min(int(s["start"] * RATE) + 800, wave.size - 1)] for s in result.segments)
    assert sum(296 <= s["start"] < 345 for s in result.segments) >= 2


def wav_with_rate(data: bytes, rate: int) -> bytes:
    bad = bytearray(data)
    bad[24:28] = int(rate).to_bytes(4, "little")
    return bytes(bad)


def test_bad_audio_fails_alone(client, speech):
    wav = speech["sentence"]
    flac = encode_as(audio.decode(wav)[0], 22050, "flac", "flac")
    bad = {"0-byte": (b"", "is empty (0 bytes)"),
           "empty recording": (audio.encode(np.zeros(0, np.float32), RATE, "wav"), "has no audio samples"),
           "unknown format": (b"This is a text file, not audio.", "unknown format"),
           "broken": (flac[:len(flac) // 2], "not a readable audio file (FLAC container"),
           "wrong sample-rate header": (wav_with_rate(wav, 3), "states a sample rate of 3 Hz")}
    good = client.transcribe(MODEL, wav).text
    results = send_together(client, [wav, *(d for d, _ in bad.values()), wav])
    assert results[0].text == good == results[-1].text
    for (name, (_, message)), got in zip(bad.items(), results[1:-1]):
        assert isinstance(got, InferenceServerException), name
        assert "field 'audio'" in got.message() and message in got.message(), (name, got.message())


def test_silence_has_an_empty_transcript(client):
    silent = client.transcribe(MODEL, audio.encode(np.zeros(3 * RATE, np.float32), RATE, "wav"))
    assert (silent.text, silent.segments, silent.duration) == ("", [], 3.0)


@pytest.mark.parametrize("options, field, message", [
    ({"prompt": "Names: Ada, Grace."}, "prompt", "this model takes no prompt"),
    ({"temperature": 0.4}, "temperature", "does not sample"),
    ({"language": "english!"}, "language", "is not a language code"),
])
def test_options_the_model_does_not_take_are_refused(client, speech, options, field, message):
    with pytest.raises(InferenceServerException, match=f"field '{field}': .*{message}"):
        client.transcribe(MODEL, speech["short"], **options)
    assert client.transcribe(MODEL, speech["short"], language="eng_Latn", temperature=0.0).text is not None


def test_word_times_and_the_cli(server, client, speech, tmp_path):
    result = client.transcribe(MODEL, speech["sentence"], words=True)
    assert result.words and all(w["start"] < w["end"] for w in result.words)
    assert " ".join(w["word"] for w in result.words) == result.text
    path = tmp_path / "speech.wav"
    path.write_bytes(speech["sentence"])
    out = tmp_path / "speech.srt"
    assert cli_main(["transcribe", "--url", server.grpc_url, "--model", MODEL, str(path), "--format", "srt",
                     "-o", str(out)]) == 0
    assert out.read_text().startswith("1\n00:00:0") and " --> " in out.read_text()


# -- the OpenAI proxy -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sdk(server, tmp_path_factory):
    with running_proxy(server.grpc_url, tmp_path_factory.mktemp("asr_proxy") / "proxy.log") as url:
        c = openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=120)
        yield c
        c.close()


def test_sdk_transcription_in_every_response_format(sdk, client, speech):
    wav = speech["sentence"]
    direct = client.transcribe(MODEL, wav, words=True)
    file = ("speech.wav", wav, "audio/wav")
    assert sdk.audio.transcriptions.create(model=MODEL, file=file).text == direct.text
    assert sdk.audio.transcriptions.create(model=MODEL, file=file, response_format="text").strip() == direct.text
    verbose = sdk.audio.transcriptions.create(model=MODEL, file=file, response_format="verbose_json",
                                              timestamp_granularities=["word", "segment"], language="en")
    assert verbose.text == direct.text and verbose.language == "en" and abs(verbose.duration - direct.duration) < 1e-3
    assert [s.text for s in verbose.segments] == [s["text"] for s in direct.segments]
    assert [(w.word, w.start, w.end) for w in verbose.words] == [(w["word"], w["start"], w["end"]) for w in direct.words]
    srt = sdk.audio.transcriptions.create(model=MODEL, file=file, response_format="srt")
    vtt = sdk.audio.transcriptions.create(model=MODEL, file=file, response_format="vtt")
    first = direct.segments[0]["text"]
    assert srt.startswith("1\n00:00:00,") and first in srt
    assert vtt.startswith("WEBVTT\n\n00:00:00.") and first in vtt


def test_sdk_streamed_transcription(sdk, client, speech):
    direct = client.transcribe(MODEL, speech["long"]).text
    events = list(sdk.audio.transcriptions.create(model=MODEL, file=("long.mp3", speech["long"], "audio/mpeg"),
                                                  stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == direct


def test_sdk_errors_name_the_field(sdk, speech):
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.transcriptions.create(model=MODEL, file=("p.wav", speech["short"], "audio/wav"), prompt="Ada")
    assert e.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.transcriptions.create(model=MODEL, file=("x.wav", b"not audio at all", "audio/wav"))
    assert e.value.body["param"] == "file" and "unknown format" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.translations.create(model=MODEL, file=("p.wav", speech["short"], "audio/wav"))
    assert e.value.body["param"] == "model" and "does not translate" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.transcriptions.create(model=MODEL, file=("p.wav", speech["short"], "audio/wav"),
                                        response_format="srt", stream=True)
    assert e.value.body["param"] == "stream"
    body = json.loads(sdk.audio.transcriptions.with_raw_response.create(
        model=MODEL, file=("p.wav", speech["short"], "audio/wav"), response_format="json").text)
    assert set(body) == {"text", "usage"} and body["usage"]["type"] == "duration"


def test_internal_steps_refuse_bad_tensors_by_name(server, client, speech):
    """The encoder and the post step called directly (as any step can be) with tensors pre never makes."""
    from triton_omni.client.triton import responses

    samples = (np.zeros(16000, np.float32), "FP32")
    spans = lambda rows: (np.asarray(rows, np.int64).reshape(-1, 4), "INT64")     # noqa: E731
    cases = [
        (f"{MODEL}_encoder", {"samples": samples, "segment_spans": spans([[0, 8000, 0, 8000]])}, "segment_spans",
         "add up to 8000"),
        (f"{MODEL}_encoder", {"samples": samples, "segment_spans": spans([[0, 16000, 0, 16000]] * 40000)},
         "segment_spans", "at most"),
        (f"{MODEL}_encoder", {"samples": (np.full(16000, np.nan, np.float32), "FP32"),
                              "segment_spans": spans([[0, 16000, 0, 16000]])}, "samples", "not finite"),
        (f"{MODEL}_encoder", {"samples": (np.zeros(100, np.float32), "FP32"),
                              "segment_spans": spans([[0, 100, 0, 100]])}, "segment_spans", "input limit"),
        (f"{MODEL}_post", {"frame_ids": (np.full(3, 10**6, np.int32), "INT32"),
                           "frame_logprobs": (np.zeros(3, np.float32), "FP32"),
                           "segment_frames": (np.array([3], np.int32), "INT32"),
                           "frame_stride": (np.array([320], np.int32), "INT32"),
                           "segment_spans": spans([[0, 960, 0, 960]]),
                           "transcription": ('{"duration": 0.06}', "BYTES")}, "frame_ids", "token ids must be in"),
    ]
    for model, values, field, message in cases:
        with pytest.raises(InferenceServerException) as e:
            list(responses(server.grpc_url, model, values, 60))
        assert f"field '{field}'" in e.value.message() and message in e.value.message(), (model, e.value.message())
    assert client.transcribe(MODEL, speech["short"]).text is not None         # the steps serve on
