"""Orpheus' pieces in-process (no server): the prompt and token layout against the release code's
conventions, the chunk plan, the talker's sink, the pre step's checks, and the codec step fed
the way the talker feeds it: streamed chunks concatenate to the non-streamed audio, bit for bit.
"""
from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request, ResponseSink, StepContext, string_array
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.chunking import ChunkPlan
from triton_omni.tts.orpheus.codec import OrpheusCodec, OrpheusCodecParams
from triton_omni.tts.orpheus.pre import OrpheusPre, OrpheusPreParams
from triton_omni.tts.orpheus.talker import ChunkedSink, chunk_plan
from triton_omni.tts.orpheus.tokens import OrpheusTokens, frames_to_codes
from triton_omni.tts.request import Speech

TPF = 7


@pytest.fixture(scope="module")
def folders(tiny_checkpoints):
    return tiny_checkpoints["orpheus"], tiny_checkpoints["snac_24khz"]


@pytest.fixture(scope="module")
def tokenizer(folders):
    return load_tokenizer(folders[0])


# --- format ---------------------------------------------------------------------------------------
def test_prompt_is_the_release_format(tokenizer):
    t = OrpheusTokens.from_tokenizer(tokenizer)
    base = tokenizer.convert_tokens_to_ids("<custom_token_0>")
    # the release hard-codes 128259 / 128260 / 128261 / 128257 / 128258 with base 128256
    assert [t.start_of_human - base, t.end_of_human - base, t.start_of_ai - base, t.start_of_speech - base,
            t.end_of_speech - base, t.audio_start - base] == [3, 4, 5, 1, 2, 10]
    ids = t.prompt(tokenizer, "tara", "Hello there.")
    words = tokenizer("tara: Hello there.").input_ids
    assert words[0] == tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    assert ids == [t.start_of_human, *words, tokenizer.convert_tokens_to_ids("<|eot_id|>"), t.end_of_human,
                   t.start_of_ai, t.start_of_speech]


def release_codes(token_numbers: list[int]) -> list[list[int]]:
    """The release decoder: `<custom_token_N>` at stream index i is code N - 10 - (i % 7) * 4096,
    and a frame's 7 codes go to codebooks as in its convert_to_audio."""
    codes = [n - 10 - (i % 7) * 4096 for i, n in enumerate(token_numbers)]
    c0, c1, c2 = [], [], []
    for i in range(0, len(codes) // 7 * 7, 7):
        f = codes[i:i + 7]
        c0 += [f[0]]
        c1 += [f[1], f[4]]
        c2 += [f[2], f[3], f[5], f[6]]
    return [c0, c1, c2]


def test_token_layout_matches_release_decoder():
    rng = random.Random(0)
    numbers = [10 + (i % 7) * 4096 + rng.randrange(4096) for i in range(7 * 5 + 3)]   # + a partial frame
    base = 1000
    got = frames_to_codes(np.array([[base + n for n in numbers]]), base + 10, 4096)
    assert [c[0].tolist() for c in got] == release_codes(numbers)
    # out-of-slot audio tokens wrap into range; non-audio tokens become code 0
    odd = frames_to_codes(np.array([[base + 10 + 4096 * 6 + 5, 3, 5, 5, 5, 5, 5]]), base + 10, 4096)
    assert odd[0].tolist() == [[5]] and odd[1].tolist() == [[0, 0]]


# --- chunk plan -----------------------------------------------------------------------------------
def test_chunk_plan_streamed_equals_whole():
    plan = ChunkPlan(first=2, size=8, left=3, right=3)
    assert plan.chunks(0, 40, final=False) == [(0, 2), (2, 10), (10, 18), (18, 26), (26, 34)]
    assert plan.chunks(0, 4, final=False) == [] and plan.chunks(0, 5, final=False) == [(0, 2)]
    rng = random.Random(1)
    for _ in range(200):
        total = rng.randrange(0, 60)
        whole = plan.chunks(0, total, final=True)
        cuts = sorted(set(rng.sample(range(total + 1), min(total + 1, rng.randrange(1, 8)))) | {total})
        streamed, before = [], 0
        for now in cuts:        # the frames known at each response; the last one ends the utterance
            streamed += [(c, plan.window(c, now)) for c in plan.chunks(before, now, final=now == total)]
            before = now
        assert streamed == [(c, plan.window(c, total)) for c in whole]
        covered = [f for s, e in whole for f in range(s, e)]
        assert covered == list(range(total))


def test_chunk_plan_follows_the_codec(folders):
    plan = chunk_plan(folders[1], 2, 8)
    assert (plan.left, plan.right) == (3, 3)


# --- talker sink ----------------------------------------------------------------------------------
class Collect(ResponseSink):
    def __init__(self):
        self.responses = []

    def send(self, outputs, final=False):
        self.responses.append((outputs, final))


def ar_responses(tokens: list[int], streaming: bool, per: int = 1, reason: str = "length"):
    """What the AR step sends: per-token (context of 4 + new) when streaming, else one at the end."""
    if not streaming:
        return [({"token_ids": np.asarray(tokens, np.int32), "num_context": np.asarray([0], np.int32),
                  "finish_reason": string_array(reason)}, True)]
    out = []
    for i in range(0, len(tokens), per):
        ctx, new = tokens[max(0, i - 4):i], tokens[i:i + per]
        last = i + per >= len(tokens)
        out.append(({"token_ids": np.asarray(ctx + new, np.int32), "num_context": np.asarray([len(ctx)], np.int32),
                     "finish_reason": string_array(reason if last else "")}, last))
    return out


def talk(tokens, streaming: bool, plan: ChunkPlan, seed: int = 5, per: int = 1):
    inner = Collect()
    sink = ChunkedSink(inner, plan, Speech(seed, "pcm", streaming).tensor(), streaming)
    for outputs, final in ar_responses(tokens, streaming, per):
        sink.send(outputs, final)
    return inner.responses


def test_talker_sends_only_playable_responses():
    plan = ChunkPlan(2, 8, 3, 3)
    tokens = list(range(1000, 1000 + 7 * 20 + 3))
    responses = talk(tokens, True, plan)
    # ready after 5, 13 frames (+ the first token of the next frame), then the end
    assert [int(o["completion_tokens"][0]) for o, _ in responses] == [35, 91, len(tokens)]
    assert [f for _, f in responses] == [False, False, True]
    second = responses[1][0]
    # context from frame 2 - 3 -> 0 (the second chunk's window starts at frame 0)
    assert second["token_ids"].tolist() == tokens[:91] and int(second["num_context"][0]) == 35
    third = responses[2][0]
    assert third["token_ids"].tolist() == tokens[7 * 7:] and int(third["num_context"][0]) == 91 - 49
    whole = talk(tokens, False, plan)
    assert len(whole) == 1 and whole[0][0]["token_ids"].tolist() == tokens and whole[0][1]


# --- codec ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def codec(folders):
    params = OrpheusCodecParams(checkpoint=str(folders[0]), codec_checkpoint=str(folders[1]), decode_batch=4)
    return OrpheusCodec(StepContext("orpheus_codec", params, "cpu", folders[0].parent))


def as_requests(responses) -> list[Request]:
    return [Request({k: v for k, v in o.items()}) for o, _ in responses]


def audio_tokens(n: int, seed: int, start: int) -> list[int]:
    rng = random.Random(seed)
    return [start + (i % 7) * 4096 + rng.randrange(4096) for i in range(n)]


def test_codec_streamed_chunks_equal_whole_utterance(codec):
    tokens = audio_tokens(7 * 19 + 4, 1, codec.audio_start)
    plan = codec.plan
    streamed = codec.execute(as_requests(talk(tokens, True, plan, per=3)))
    whole = codec.execute(as_requests(talk(tokens, False, plan)))
    chunks = [r["waveform"] for r in streamed]
    assert [len(c) // 2048 for c in chunks] == [2, 8, 9]         # small first chunk, then 8, then the rest
    assert np.array_equal(np.concatenate(chunks), whole[0]["waveform"])
    assert len(whole[0]["waveform"]) == 19 * 2048 and np.abs(whole[0]["waveform"]).max() > 0.05
    assert all(int(r["sample_rate"][0]) == 24000 for r in streamed)
    # the same chunks decoded in one batch with another utterance's: the same bits
    other = as_requests(talk(audio_tokens(7 * 30, 2, codec.audio_start), True, plan, per=5))
    mixed = codec.execute(as_requests(talk(tokens, True, plan, per=3)) + other)
    assert all(np.array_equal(a["waveform"], b["waveform"]) for a, b in zip(streamed, mixed))
    # another seed: other noise, other audio
    reseeded = codec.execute(as_requests(talk(tokens, False, plan, seed=6)))
    assert not np.array_equal(reseeded[0]["waveform"], whole[0]["waveform"])


def test_codec_refuses_short_context_for_that_request_only(codec):
    good = as_requests(talk(audio_tokens(7 * 12, 3, codec.audio_start), False, codec.plan))[0]
    # 20 new tokens after 80: frame 14 makes chunk [2, 10) ready, whose window starts at token 0
    bad = Request({"token_ids": np.arange(20, dtype=np.int32) + codec.audio_start,
                   "num_context": np.asarray([0], np.int32), "completion_tokens": np.asarray([100], np.int32),
                   "finish_reason": string_array(""), "speech": Speech(1, "pcm", True).tensor()})
    out = codec.execute([bad, good])
    assert isinstance(out[0], InvalidInput) and out[0].field == "num_context" and "context" in str(out[0])
    assert len(out[1]["waveform"]) == 12 * 2048


def test_cancelled_reply_decodes_nothing(codec):
    (outputs, _), = talk(audio_tokens(70, 4, codec.audio_start), False, codec.plan)
    outputs["finish_reason"] = string_array("cancelled")
    assert codec.execute([Request(outputs)])[0]["waveform"].size == 0


# --- pre ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pre(folders):
    params = OrpheusPreParams(checkpoint=str(folders[0]), max_model_len=512)
    return OrpheusPre(StepContext("orpheus_pre", params, "cpu", folders[0].parent))


def speech_request(**values) -> Request:
    tensors = {}
    for k, v in values.items():
        if isinstance(v, bool):
            tensors[k] = np.asarray([v])
        elif isinstance(v, float):
            tensors[k] = np.asarray([v], np.float32)
        else:
            tensors[k] = np.array([(json.dumps(v) if isinstance(v, dict) else v).encode()], dtype=np.object_)
    return Request(tensors)


def test_pre_builds_prompt_sampling_and_speech(pre):
    out = pre.one(speech_request(text="Hello.", voice="leo", response_format="FLAC",
                                 sampling_parameters={"seed": 9, "temperature": 0.9}))
    sampling = json.loads(out["sampling"][0])
    assert out["input_ids"].tolist() == pre.tokens.prompt(pre.tokenizer, "leo", "Hello.")
    assert sampling["seed"] == 9 and sampling["temperature"] == 0.9 and sampling["top_p"] == 0.8
    assert sampling["stop_token_ids"] == [pre.tokens.end_of_speech]
    assert sampling["max_tokens"] == 512 - len(out["input_ids"])       # all the room left (< 1200)
    speech = json.loads(out["speech"][0])
    assert abs(speech.pop("arrival") - time.time()) < 60          # when the request arrived (the metrics count from it)
    assert speech == {"seed": 9, "response_format": "flac", "stream": False}
    drawn = json.loads(pre.one(speech_request(text="Hi", stream=True))["speech"][0])
    assert isinstance(drawn["seed"], int) and drawn["stream"] and drawn["response_format"] == "mp3"


@pytest.mark.parametrize("values,field", [
    ({}, "field 'text': is empty"),
    ({"text": "   "}, "field 'text': is empty"),
    ({"text": "x" * 5000}, "field 'text': is too long: 5000 characters"),
    ({"text": "pack my box " * 120}, "field 'text': is too long: the prompt has"),
    ({"text": "hi", "voice": "alloy"}, "field 'voice': unknown voice 'alloy'"),
    ({"text": "hi", "response_format": "aac"}, "field 'response_format'"),
    ({"text": "hi", "speed": 1.5}, "field 'speed': this model speaks at 1.0"),
    ({"text": "hi", "speed": 9.0}, "field 'speed': must be in [0.25, 4.0]"),
    ({"text": "hi", "reference_audio": "RIFF...."}, "field 'reference_audio': this model does not clone voices"),
    ({"text": "hi", "sampling_parameters": {"stop": ["x"]}}, "field 'sampling_parameters.stop'"),
    ({"text": "hi", "sampling_parameters": {"max_tokens": 0}}, "field 'sampling_parameters.max_tokens'"),
    ({"text": "hi", "sampling_parameters": {"max_tokens": 9000}}, "field 'sampling_parameters.max_tokens'"),
    ({"text": "hi", "sampling_parameters": {"repetition_penalty": 9.0}}, "field 'sampling_parameters.repetition_penalty'"),
    ({"text": "hi", "sampling_parameters": {"temperture": 1.0}}, "unknown key 'temperture'"),
])
def test_pre_refuses_bad_input(pre, values, field):
    with pytest.raises(InvalidInput) as err:
        pre.one(speech_request(**values))
    assert field in str(err.value)
