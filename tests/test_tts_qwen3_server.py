"""Qwen3-TTS (`qwen3_tts`) on a live tritonserver with the tiny checkpoint: streamed PCM chunks, a WAV
file against the in-process talker + codec, batching, bad input. The speech route's tensor contract.

The weights are tiny and random (the audio is noise); the checks are about the serving path: the
streamed chunks (a small first one) concatenate to exactly the non-streamed audio for the same seed,
the file decodes at 24 kHz to the in-process decode of the in-process frames, bad requests fail alone
(naming the field) while a neighbour's stream goes on.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from triton_omni.media import audio
from tests.conftest import rounds_until_batched, running_server
from tests.test_tts_server import fails_beside, stream_speech

pytestmark = pytest.mark.server

MODEL = "qwen3_tts"
FRAME_BYTES = 1920 * 2            # one 12.5 Hz frame of s16 samples at 24 kHz
DTYPES = {"stream": "BOOL", "speed": "FP32"}
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("qwen3_tts"), [MODEL], [f"{MODEL}.max_model_len={MAX_MODEL_LEN}"]) as s:
        yield s


def speak(server, text="Hello there.", sampling=None, timeout=90, **values) -> list[tuple[bytes, int, str]]:
    tensors = {"text": (text, "BYTES"), "sampling_parameters": (sampling, "BYTES")}
    tensors.update({k: (v, DTYPES.get(k, "BYTES")) for k, v in values.items()})
    return stream_speech(server, MODEL, tensors, timeout)


def audio_s16(wave: np.ndarray) -> np.ndarray:
    """What a float waveform reads back as from a served s16 file (audio.encode, audio.decode)."""
    return np.rint(wave.astype(np.float32) * np.float32(32767)).clip(-32768, 32767) / 32768


def seeded(seed=3, frames=20, **extra):
    return {"seed": seed, "max_tokens": frames, **extra}


def test_streamed_chunks_equal_the_non_streamed_audio(server):
    chunks = speak(server, sampling=seeded(), stream=True, voice="ryan")
    # 20 frames: a small first chunk (3 frames, 240 ms), one of 12, then the rest at the end
    assert [len(a) // FRAME_BYTES for a, _, _ in chunks] == [3, 12, 5]
    assert [r for _, _, r in chunks] == ["", "", "length"] and {s for _, s, _ in chunks} == {24000}
    streamed = b"".join(a for a, _, _ in chunks)
    (pcm, rate, reason), = speak(server, sampling=seeded(), voice="ryan", response_format="pcm")
    assert (rate, reason) == (24000, "length")
    assert pcm == streamed
    assert np.abs(np.frombuffer(pcm, "<i2")).max() > 100          # not silence
    other = speak(server, sampling=seeded(seed=4), voice="ryan", response_format="pcm")[0][0]
    assert other != pcm and len(other) == len(pcm)


@pytest.mark.parametrize("language", [None, "German"])
def test_wav_equals_the_in_process_talker_and_codec(server, tiny_checkpoints, language):
    from triton_omni.text.tokenizer import load_tokenizer
    from triton_omni.tts.qwen3_tts.codec import load_codec
    from triton_omni.tts.qwen3_tts.generate import generate_codes
    from triton_omni.tts.qwen3_tts.model import assistant_text, load_qwen3_tts

    text, frames = "The quick brown fox jumps over the lazy dog.", 16
    chosen = {"language": language} if language else {}
    (wav, rate, reason), = speak(server, text, {"temperature": 0, "max_tokens": frames}, voice="vivian",
                                 response_format="wav", **chosen)
    back, wav_rate = audio.decode(wav)
    assert rate == wav_rate == 24000 and reason == "length"

    folder = tiny_checkpoints[MODEL]
    model, tokenizer = load_qwen3_tts(folder), load_tokenizer(folder)
    with torch.no_grad():
        prompt = model.build_prompt(tokenizer(assistant_text(text))["input_ids"], language or "auto", "vivian")
    codes = generate_codes(model, [prompt], frames)[0]            # greedy, the reference's loop
    assert codes.shape == (frames, 16)
    want = load_codec(folder).decode_window(codes[None])[0].numpy()   # one window over the whole utterance
    assert back.shape == want.shape == (frames * 1920,)
    # the served chunks are decoded with the decoder's state carried over: the whole decode up to float
    # rounding (~4e-6), which can move a sample across an s16 rounding boundary: at most one s16 step
    assert np.abs(back - audio_s16(want)).max() <= 1 / 32768
    assert np.abs(want).max() > 0.01


def test_concurrent_streams_are_batched_and_equal_one_by_one(server):
    texts = ["Hello there.", "The quick brown fox", "pack my box", "Numbers 0123"]

    def say(i: int) -> list:
        return speak(server, texts[i], seeded(i, 16), stream=True, voice=["vivian", "ryan", "eric", "dylan"][i])

    alone = [say(i) for i in range(len(texts))]

    def together() -> list:
        with ThreadPoolExecutor(len(texts)) as pool:
            return list(pool.map(say, range(len(texts))))

    rounds = rounds_until_batched(server, f"{MODEL}_codec", together)
    # the codec ran once per talker response, several requests' responses per execution
    for chunks, inferences, _ in rounds:
        assert inferences == sum(len(c) for c in chunks)
    assert rounds[-1][2] < rounds[-1][1], rounds[-1][1:]
    # how the talker's frames group into responses depends on timing (a response may carry two
    # chunks); the audio does not
    audio_of = lambda chunks: (b"".join(a for a, _, _ in chunks), chunks[-1][2])  # noqa: E731
    for got, _, _ in rounds:
        assert [audio_of(c) for c in got] == [audio_of(c) for c in alone]
        assert all(len(c[0][0]) == 3 * FRAME_BYTES and len(audio_of(c)[0]) == 16 * FRAME_BYTES for c in got)


BAD = [
    ("empty text", {"text": ""}, "field 'text': is empty"),
    ("unknown voice", {"voice": "alloy"}, "field 'voice': unknown voice 'alloy'"),
    ("reference audio", {"reference_audio": "RIFF0000WAVE"}, "field 'reference_audio'"),
    ("text too long", {"text": "pack my box " * 60}, "field 'text': is too long"),
    ("text far too long", {"text": "x" * 5000}, "field 'text': is too long: 5000 characters"),
    ("max_tokens above context", {"sampling": {"max_tokens": 5000}}, "field 'sampling_parameters.max_tokens'"),
    ("stop", {"sampling": {"stop": ["x"]}}, "field 'sampling_parameters.stop'"),
    ("unknown language", {"language": "klingon"}, "field 'language': unknown language 'klingon'"),
    ("instructions on a 0.6B", {"instructions": "Speak slowly."}, "field 'instructions': this model takes no"),
]


@pytest.mark.parametrize("case,values,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_input_fails_that_request_only(server, case, values, expect):
    error, chunks = fails_beside(lambda: speak(server, **{"text": "Hi.", **values}),
                                 lambda: speak(server, "Hello there.", seeded(frames=8), stream=True))
    assert expect in error, error
    assert chunks[-1][2] == "length" and sum(len(a) for a, _, _ in chunks) == 8 * FRAME_BYTES
