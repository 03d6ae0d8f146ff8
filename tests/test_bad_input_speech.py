"""Bad tensors sent straight to the internal steps of every speech model and of a chat model, on live
servers: an oversized tensor is refused by name within seconds (before the step allocates for it), a
malformed value is refused by name (INVALID_ARG, not a raw Python exception), and the model still
serves a good request afterwards (the step's process survived).

Two servers, each with several models, so that the module starts tritonserver twice only.
"""
from __future__ import annotations

import json
import queue
import time
import uuid
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from triton_omni.client.tensors import make_inputs
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.guards import InputGuard
from triton_omni.runtime.step import Request, string_array
from triton_omni.tts.checks import max_samples, waveform
from triton_omni.tts.post import SpeechPost
from triton_omni.tts.request import Speech
from tests.conftest import running_server
from tests.test_tts_server import stream_speech

HUGE = 1 << 20                 # entries of an oversized tensor: 4 MB on the wire, far over every bound
SPEECH = (Speech(1, "pcm", False).tensor()[0].decode(), "BYTES")
I32, F32 = "INT32", "FP32"


def ints(n: int, value: int = 0) -> tuple[np.ndarray, str]:
    return np.full(n, value, np.int32), I32


def floats(n: int, value: float = 0.0) -> tuple[np.ndarray, str]:
    return np.full(n, value, np.float32), F32


def one(value, dtype=I32):
    return np.asarray([value], dtype=np.float32 if dtype == F32 else np.int32), dtype


@dataclass
class Case:
    model: str                 # the step called
    good: dict                 # valid tensors (name -> (value, dtype)) the bad ones replace
    oversized: str | None      # the input sent with HUGE entries (None: no bound a request passes cheaply)
    bad: dict                  # a malformed value
    bad_name: str              # the input its error names
    decoupled: bool = False


GROUPS = {
    "orpheus_kokoro_omnivoice_chat": ["orpheus_tts", "kokoro_tts", "omnivoice_tts", "qwen3_chat"],
    "fish_qwen3_chatterbox": ["fish_s2_tts", "qwen3_tts", "chatterbox_tts"],
}
OVERRIDES = {"orpheus_kokoro_omnivoice_chat": ["orpheus_tts.max_model_len=512", "omnivoice_tts.generate.num_step=4",
                                               "qwen3_chat.ar.max_num_seqs=4", "orpheus_tts.talker.max_num_seqs=4"],
             "fish_qwen3_chatterbox": ["fish_s2_tts.max_model_len=512", "qwen3_tts.max_model_len=512",
                                       "fish_s2_tts.talker.max_num_seqs=4", "qwen3_tts.talker.max_num_seqs=4"]}
TALKER = {"sampling": ('{"max_tokens": 8, "seed": 1}', "BYTES"), "speech": SPEECH}
CHUNK_REPLY = {"num_context": one(0), "completion_tokens": one(7), "finish_reason": ("length", "BYTES"), "speech": SPEECH}

CASES = {
    "orpheus_kokoro_omnivoice_chat": [
        Case("orpheus_tts_codec", {"token_ids": ints(7), **CHUNK_REPLY}, "token_ids",
             {"num_context": one(20)}, "num_context"),
        Case("orpheus_tts_talker", {"input_ids": ints(12, 1), **TALKER}, "input_ids",
             {"speech": ('{"seed": "x"}', "BYTES")}, "speech.seed", decoupled=True),
        Case("orpheus_tts_post", {"waveform": floats(480), "sample_rate": one(24000), "finish_reason": ("stop", "BYTES"),
                                  "speech": SPEECH}, None, {"waveform": floats(480, np.nan)}, "waveform"),
        Case("kokoro_tts_synth", {"phoneme_ids": ints(5), "segments": one(5),
                                  "style": (np.zeros((1, 256), np.float32), F32),
                                  "speech": SPEECH}, "phoneme_ids", {"phoneme_ids": ints(5, 1 << 20)}, "phoneme_ids"),
        Case("kokoro_tts_chunks", {"waveform": floats(480), "sample_rate": one(24000), "speech": SPEECH}, None,
             {"sample_rate": one(7)}, "sample_rate", decoupled=True),
        Case("omnivoice_tts_generate", {"prompt_ids": ints(4, 1), "frames": one(4), "temperature": one(0.0, F32),
                                        "speech": SPEECH, "reference_codes": ints(0)}, "prompt_ids",
             {"frames": one(1 << 30)}, "frames"),
        Case("omnivoice_tts_codec", {"codes": ints(8 * 4), "speech": SPEECH, "reference_rms": one(-1.0, F32)},
             "codes", {"codes": ints(8 * 4, -3)}, "codes"),
        Case("qwen3_chat_post", {"token_ids": ints(3, 1), "num_context": one(0), "stop_text": ("", "BYTES"),
                                 "finish_reason": ("stop", "BYTES"), "prompt_tokens": one(3),
                                 "completion_tokens": one(3)}, "token_ids", {"token_ids": ints(3, -5)}, "token_ids"),
        Case("qwen3_chat_pre", {"text_input": ("hello", "BYTES")}, "text_input",
             {"text_input": (b"\xff\xfe", "BYTES")}, "text_input"),
        Case("qwen3_chat_ar", {"input_ids": ints(4, 1), "sampling": ('{"max_tokens": 4, "seed": 1}', "BYTES")},
             "input_ids", {"sampling": ('{"top_p": 7}', "BYTES")}, "sampling_parameters.top_p", decoupled=True),
    ],
    "fish_qwen3_chatterbox": [
        Case("fish_s2_tts_codec", {"codes": ints(4 * 7), **CHUNK_REPLY}, "codes", {"codes": ints(7)}, "codes"),
        Case("fish_s2_tts_talker", {"input_ids": ints(5 * 4), **TALKER}, "input_ids",     # tiny: 4 codebooks
             {"input_ids": ints(5 * 4, -1)}, "input_ids", decoupled=True),
        Case("qwen3_tts_codec", {"codes": ints(16 * 3), "stream_id": ("s1", "BYTES"), "first_frame": one(0),
                                 "finish_reason": ("stop", "BYTES"), "speech": SPEECH}, "codes",
             {"first_frame": one(1 << 30)}, "first_frame"),
        Case("qwen3_tts_talker", {"input_ids": ints(12, 1), "speaker": ("vivian", "BYTES"), **TALKER}, "input_ids",
             {"ref_codes": ints(5)}, "ref_codes", decoupled=True),
        Case("chatterbox_tts_t3", {"text_ids": ints(4, 1), "sampling": ('{"max_tokens": 4}', "BYTES"),
                                   "speech": SPEECH, "speaker_emb": floats(256), "prompt_tokens": ints(10)}, "text_ids",
             {"speaker_emb": floats(10)}, "speaker_emb"),
        Case("chatterbox_tts_s3gen", {"speech_tokens": ints(4), "finish_reason": ("stop", "BYTES"), "speech": SPEECH,
                                      "ref_tokens": ints(10), "ref_mel": floats(20 * 80),
                                      "ref_embedding": floats(192)}, "speech_tokens",
             {"speech_tokens": ints(4, 99999)}, "speech_tokens"),
    ],
}
# a good request to each model, once its steps have been sent bad ones
GOOD = {"orpheus_tts": {"text": "Hi.", "sampling_parameters": {"seed": 1, "max_tokens": 7 * 8, "ignore_eos": True}},
        "kokoro_tts": {"text": "Hi.", "phonemes": "həlˈO, wˈɜɹld!"},
        "omnivoice_tts": {"text": "Hi there."},
        "fish_s2_tts": {"text": "Hi.", "sampling_parameters": {"seed": 1, "max_tokens": 8}},
        "qwen3_tts": {"text": "Hi.", "sampling_parameters": {"seed": 1, "max_tokens": 8}},
        "chatterbox_tts": {"text": "Hi.", "sampling_parameters": {"seed": 1, "max_tokens": 8}}}


def call(server, case: Case, tensors: dict, timeout: float = 60) -> None:
    """Send one request to a step; its error re-raised as InferenceServerException."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        if not case.decoupled:
            client.infer(case.model, make_inputs(grpcclient, tensors), client_timeout=timeout)
            return
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put(error))
        client.async_stream_infer(case.model, make_inputs(grpcclient, tensors), request_id=uuid.uuid4().hex)
        error = results.get(timeout=timeout)
        client.stop_stream(cancel_requests=True)
        if error is not None:
            raise error
    finally:
        client.close()


def refused(server, case: Case, tensors: dict) -> tuple[str, float]:
    """The error's text and how long it took. INVALID_ARG: a gRPC stream's error carries no status code,
    but its text does tell: an InvalidInput's is "field 'NAME': ...", a server fault's "TypeName: ..."."""
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        call(server, case, tensors)
    message = err.value.message()
    assert case.decoupled or err.value.status() == "StatusCode.INVALID_ARGUMENT", err.value
    assert message.startswith("field '") and "Traceback" not in message and len(message) < 2100, message
    return message, time.monotonic() - start


class Servers:
    """One server at a time: asking for another group's stops the one running (memory: each holds a
    dozen step processes)."""

    def __init__(self, tmp_path_factory):
        self.tmp, self.group, self.running, self.server = tmp_path_factory, None, None, None

    def get(self, group: str):
        if group != self.group:
            self.close()
            self.running = running_server(self.tmp.mktemp(group), GROUPS[group], OVERRIDES[group])
            self.server, self.group = self.running.__enter__(), group
        return self.server

    def close(self) -> None:
        if self.running is not None:
            self.running.__exit__(None, None, None)
            self.running = self.group = None


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_checkpoints):
    s = Servers(tmp_path_factory)
    yield s
    s.close()


def check_refused(server, case: Case) -> None:
    if case.oversized:
        dtype = case.good[case.oversized][1]
        huge = {case.oversized: floats(HUGE) if dtype == F32 else ints(HUGE) if dtype == I32 else
                (b"x" * 2 * HUGE, dtype)}     # a prompt's bytes
        message, seconds = refused(server, case, {**case.good, **huge})
        assert message.startswith(f"field '{case.oversized}'") and "at most" in message, message
        assert seconds < 10, f"{case.model} took {seconds:.1f} s to refuse {HUGE} entries"
    message, _ = refused(server, case, {**case.good, **case.bad})
    assert message.startswith(f"field '{case.bad_name}'"), message


def check_speaks(server, model: str) -> None:
    values = {k: (json.dumps(v) if isinstance(v, dict) else v, "BYTES") for k, v in GOOD[model].items()}
    responses = stream_speech(server, model, values, timeout=120)
    assert responses[-1][2] in ("stop", "length") and sum(len(a) for a, _, _ in responses) > 0


# per server: each step's bad requests, then a good request to each of its speech models
PARAMS = [p for group, cases in CASES.items() for p in
          [pytest.param(group, case, id=case.model) for case in cases] +
          [pytest.param(group, model, id=f"{model}_afterwards") for model in GROUPS[group] if model in GOOD]]


@pytest.mark.server
@pytest.mark.parametrize("group,check", PARAMS)
def test_bad_inputs_refused_by_name_then_the_model_still_speaks(servers, group, check):
    server = servers.get(group)
    if isinstance(check, Case):
        check_refused(server, check)
    else:
        check_speaks(server, check)


def test_speech_json_is_checked():
    def parse(text):
        return Speech.from_request(Request({"speech": string_array(text)}))

    assert parse('{"seed": 3, "response_format": "wav", "stream": true}') == Speech(3, "wav", True)
    for text, name in [("{}", "speech.seed"), ('{"seed": 1, "x": 2}', "speech"), ('{"seed": 1.5}', "speech.seed"),
                       ('{"seed": 1, "response_format": "aiff"}', "speech.response_format"),
                       ('{"seed": 1, "stream": "yes"}', "speech.stream"), ("[1]", "speech")]:
        with pytest.raises(InvalidInput) as err:
            parse(text)
        assert err.value.field == name, (text, err.value)


def test_waveform_bound_and_checks():
    post = SpeechPost.__new__(SpeechPost)
    post.params = SpeechPost.Params()
    guard = InputGuard(SpeechPost.inputs, post.input_limits())
    assert guard.bounds["waveform"].max_dims == (max_samples(post.params.max_seconds),) == (1200 * 48000,)

    def check(wave, rate=24000, seconds=1.0):
        req = Request({"waveform": np.asarray(wave, np.float32), "sample_rate": np.asarray([rate], np.int32)})
        with pytest.raises(InvalidInput) as err:
            waveform(req, seconds)
        return err.value.field

    assert check(np.zeros(24001)) == "waveform" and check([0.0, np.inf]) == "waveform"
    assert check([0.0], rate=0) == "sample_rate"
    ok = Request({"waveform": np.zeros(24000, np.float32), "sample_rate": np.asarray([24000], np.int32)})
    assert waveform(ok, 1.0)[1] == 24000
