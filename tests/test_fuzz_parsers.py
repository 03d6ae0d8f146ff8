"""Property-based fuzzing of the request parsers: whatever a client sends, a parser returns its typed
request or raises InvalidInput naming a field, never another exception (which the server would answer
as INTERNAL with a traceback)."""
from __future__ import annotations

import json

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from triton_omni.ar.sampling import SamplingParams  # noqa: E402
from triton_omni.asr.request import Abilities, parse_options  # noqa: E402
from triton_omni.image.request import ImageLimits, parse_request as parse_image  # noqa: E402
from triton_omni.omni.chat import AudioInputs, parse_audio_messages  # noqa: E402
from triton_omni.runtime.errors import InvalidInput  # noqa: E402
from triton_omni.runtime.step import Request  # noqa: E402
from triton_omni.text.chat import parse_messages  # noqa: E402
from triton_omni.text.replies import ReplyOptions  # noqa: E402
from triton_omni.tts.request import parse_speech  # noqa: E402
from triton_omni.video.request import VideoLimits, parse_request as parse_video  # noqa: E402

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NUMBERS = st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 2**31, 2**63, 1e308, -1e308, 1.5, 0.5]))
JSON = st.recursive(st.none() | st.booleans() | NUMBERS | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=12)
SAMPLING_KEYS = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n", "stop", "stop_token_ids",
                 "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs",
                 "ignore_eos", "guided_decoding", "thinking_budget", "min_tokens", "nope"]
# values a client may put in a string tensor: text, JSON, bytes that are no UTF-8
STRINGS = st.one_of(st.text(max_size=40), JSON.map(json.dumps), st.binary(max_size=16),
                    st.sampled_from(["64x64", "0x0", "99999x99999", "-8x8", "axb", "48x48", "", " "]))


def only_invalid_input(parse) -> None:
    try:
        parse()
    except InvalidInput as exc:
        assert exc.field and str(exc).startswith(f"field '{exc.field}'")


def string(value) -> np.ndarray:
    return np.array([value.encode() if isinstance(value, str) else value], dtype=np.object_)


@FUZZ
@given(st.dictionaries(st.sampled_from(SAMPLING_KEYS), JSON, max_size=6) | JSON)
def test_sampling_parameters(raw):
    def parse():
        params = SamplingParams.from_dict(raw)
        params.resolve(8, 64, 100)
    only_invalid_input(parse)


@FUZZ
@given(JSON | st.lists(st.dictionaries(st.sampled_from(["role", "content", "name", "tool_calls", "x"]), JSON,
                                        max_size=3), max_size=4))
def test_chat_messages(raw):
    only_invalid_input(lambda: parse_messages(raw))


AUDIO_PARTS = st.fixed_dictionaries({"type": st.sampled_from(["text", "input_audio", "audio_url", "audio", "file", "image"])},
                                    optional={"text": JSON, "input_audio": JSON | st.fixed_dictionaries(
                                        {"data": st.text(max_size=12) | JSON, "format": JSON}), "audio_url": JSON,
                                        "file": JSON | st.fixed_dictionaries({"file_data": st.text(max_size=30)})})


@FUZZ
@given(JSON | st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]) | JSON},
                                             optional={"content": JSON | st.lists(AUDIO_PARTS | JSON, max_size=3)}),
                       max_size=3), st.lists(st.binary(max_size=8), max_size=2))
def test_chat_messages_with_audio(raw, audios):
    only_invalid_input(lambda: parse_audio_messages(raw, AudioInputs(np.array(audios, dtype=object) if audios else None)))


@FUZZ
@given(JSON)
def test_reply_options(raw):
    only_invalid_input(lambda: ReplyOptions.from_json(raw))


def requests(names: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """A Request of any subset of `names`, each a one-item tensor."""
    return st.fixed_dictionaries({}, optional=names).map(lambda d: Request(d))


NUMERIC = NUMBERS.map(lambda v: np.array([v], dtype=np.float64 if isinstance(v, float) else np.int64)
                      if abs(v) < 2**62 or isinstance(v, float) else np.array([0], np.int64))
IMAGE_FIELDS = {"prompt": STRINGS.map(string), "negative_prompt": STRINGS.map(string), "size": STRINGS.map(string),
                "output_format": STRINGS.map(string), "num_inference_steps": NUMERIC, "guidance_scale": NUMERIC,
                "seed": NUMERIC, "n": NUMERIC}


@FUZZ
@given(requests(IMAGE_FIELDS))
def test_image_requests(req):
    only_invalid_input(lambda: parse_image(req, 16, ImageLimits()))


@FUZZ
@given(requests({**IMAGE_FIELDS, "num_frames": NUMERIC, "fps": NUMERIC, "guidance_scale_2": NUMERIC}))
def test_video_requests(req):
    only_invalid_input(lambda: parse_video(req, 16, 4, VideoLimits(), 1))


@FUZZ
@given(requests({"text": STRINGS.map(string), "voice": STRINGS.map(string), "speed": NUMERIC,
                 "language": STRINGS.map(string), "instructions": STRINGS.map(string)}))
def test_speech_requests(req):
    only_invalid_input(lambda: parse_speech(req, ["alice", "bob"], "alice", 500, (0.5, 2.0), ["English"], True))


@FUZZ
@given(requests({"language": STRINGS.map(string), "prompt": STRINGS.map(string), "temperature": NUMERIC,
                 "timestamp_granularities": STRINGS.map(string), "task": STRINGS.map(string)}))
def test_transcription_requests(req):
    only_invalid_input(lambda: parse_options(req, Abilities(prompt=True, sampling=True, translate=True), 12.0))
