"""Fish S2-Pro (`fish_s2_tts`): the in-process talker, codec and cloning prompt on the tiny checkpoint
(converters/tiny_fish.py), and the ensemble on a live tritonserver: streamed PCM chunks, files, batching,
voice cloning, bad input. Parity against the fish-speech package: tests/test_tts_fish_parity.py.

The weights are tiny and random (the audio is noise); the served checks are about the serving path: the
streamed chunks concatenate to exactly the non-streamed audio for a seed, files decode at their rate,
concurrent requests share talker / codec executions, bad requests fail alone naming the field.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from triton_omni.media import audio
from tests.conftest import rounds_until_batched, running_server
from tests.test_tts_server import fails_beside, stream_speech

MODEL = "fish_s2_tts"
FRAME_BYTES = 2048 * 2            # one frame of s16 samples (the tiny codec has the release's 2048 a frame)
DTYPES = {"stream": "BOOL", "speed": "FP32"}
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def folder(tiny_checkpoints):
    return tiny_checkpoints["fish_s2"]


def voice_clip(seconds: float = 1.5, rate: int = 24000) -> np.ndarray:
    """A voice-like clip: a gliding tone with harmonics."""
    t = np.arange(int(seconds * rate)) / rate
    pitch = 2 * np.pi * np.cumsum(150 + 30 * np.sin(2 * np.pi * 2 * t)) / rate
    return (sum(0.2 / k * np.sin(k * pitch) for k in range(1, 5)) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
            ).astype(np.float32)


CLIP = audio.encode(voice_clip(), 24000, "flac")
CLIP_TEXT = "Pack my box with five dozen jugs."


def greedy_frames(folder, text: str, frames: int) -> torch.Tensor:
    """The talker on the AR engine, in process, greedy: frames [F, N + 1]."""
    from triton_omni.ar.config import EngineConfig
    from triton_omni.ar.sampling import SamplingParams
    from triton_omni.text.tokenizer import load_tokenizer
    from triton_omni.tts.fish.model import FishPrompt, fish_engine, load_fish, prompt_ids

    model = load_fish(folder)
    ids = prompt_ids(load_tokenizer(folder), text, model.num_codebooks)
    engine = fish_engine(model, EngineConfig(max_num_seqs=2, max_model_len=MAX_MODEL_LEN, enforce_eager=True, use_triton_kernels=False))
    out = engine.generate([FishPrompt(ids, 0.0, 0.9, 30)], SamplingParams(max_tokens=frames, temperature=0.0, seed=1))
    return torch.tensor(out[0])


def test_engine_frames_equal_a_plain_loop(folder):
    """The engine's batched frame step against the model's parts run by hand (full-sequence slow
    forward every step, teacher-forced fast logits): same greedy frames."""
    from triton_omni.models.context import ForwardContext
    from triton_omni.text.tokenizer import load_tokenizer
    from triton_omni.tts.fish.model import load_fish, prompt_ids
    from triton_omni.tts.qwen3_tts.generate import bind_cache

    text, frames = "Hello there, how are you?", 12
    got = greedy_frames(folder, text, frames)
    model = load_fish(folder)
    ids = prompt_ids(load_tokenizer(folder), text, model.num_codebooks)
    bias = model.main_bias("cpu")
    with torch.no_grad():
        for f in range(got.shape[0]):
            seq = torch.cat([ids, got[:f]])
            bind_cache(model, 1, len(seq))
            ctx = ForwardContext(is_prefill=True, slot_mapping=torch.arange(len(seq)), state_slots=torch.arange(1),
                                 seq_lens=[len(seq)], cu_seqlens=torch.tensor([0, len(seq)]).int())
            hidden = model(model.embed(seq), torch.arange(len(seq)), ctx)[-1:]
            main = int((model.compute_logits(hidden)[0] + bias).argmax())
            assert main == int(got[f, 0]), f
            fast = model.fast_logits(hidden, got[f:f + 1, 1:])
            assert fast[0].argmax(-1).tolist() == got[f, 2:].tolist(), f


def test_codec_chunks_against_a_whole_decode(folder):
    """Chunked decode windows (the served plan) against one whole-utterance decode: the first chunks
    (within context_frames of the start) equal it up to rounding; later ones differ (measured, printed:
    with random weights and 8 frames of context they differ a lot, so only their size is checked)."""
    from triton_omni.tts.chunking import ChunkPlan
    from triton_omni.tts.fish.codec import load_codec

    codec = load_codec(folder / "codec.pth")
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 32, (1, codec.num_codebooks, 40), generator=g)
    whole = codec.decode(codes)[0]
    plan, fs = ChunkPlan(4, 16, 8, 0), codec.frame_samples
    pieces = []
    for a, b in plan.chunks(0, 40, final=True):
        s, e = plan.window((a, b), 40)
        pieces.append(codec.decode(codes[..., s:e])[0][(a - s) * fs:(b - s) * fs])
    chunked = torch.cat(pieces)
    assert chunked.shape == whole.shape == (40 * fs,)
    # windows that start at frame 0: the whole decode up to float rounding (other lengths)
    assert torch.allclose(chunked[:12 * fs], whole[:12 * fs], atol=1e-4)
    diff = (chunked - whole).abs().max().item()
    print(f"chunked (8 frames of context) vs whole decode: max abs diff {diff:.3g}")
    assert np.isfinite(diff) and whole.abs().max() > 0.01


def test_pre_puts_the_clip_codes_after_its_transcript(folder):
    """The cloning prompt: the system turn holds the tagged transcript, then the clip's frames (main id
    semantic_begin + code 0, then the frame's codes, as the encoder gives them); the rest is the plain
    prompt's user and assistant turns."""
    from triton_omni.media.audio_signal import resample
    from triton_omni.runtime.step import StepContext
    from triton_omni.tts.fish.codec import load_codec_encoder
    from triton_omni.tts.fish.steps import FishPre, FishPreParams
    from tests.test_tts_omnivoice import request

    pre = FishPre(StepContext("pre", FishPreParams(checkpoint=str(folder)), "cpu", folder.parent))
    n, tok = pre.config.num_codebooks, pre.tokenizer
    ids = pre.one(request(text="Hello there.", reference_audio=CLIP, reference_text=CLIP_TEXT))["input_ids"]
    ids = torch.from_numpy(ids.astype(np.int64)).reshape(-1, n + 1)
    plain = torch.from_numpy(pre.one(request(text="Hello there."))["input_ids"].astype(np.int64)).reshape(-1, n + 1)
    wave, _ = audio.decode(CLIP)
    codes = load_codec_encoder(folder / "codec.pth").encode(resample(torch.from_numpy(wave), 24000, 44100))
    assert codes.shape == (n, -(-int(1.5 * 44100) // 2048))
    frames = (ids[:, 0] >= pre.config.semantic_begin) & (ids[:, 0] <= pre.config.semantic_end)
    assert torch.equal(ids[frames, 1:].T, codes) and torch.equal(ids[frames, 0], codes[0] + pre.config.semantic_begin)
    start = int(frames.nonzero()[0])
    head = tok.decode(ids[:start, 0].tolist())
    assert head.endswith(f"Text:\n<|speaker:0|>{CLIP_TEXT}\n\nSpeech:\n") and not ids[~frames, 1:].any()
    end = plain[:, 0].tolist().index(pre.config.im_end)      # the plain prompt from its system turn's end
    assert torch.equal(ids[start + codes.shape[1]:], plain[end:])


# --- the live server ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("fish"), [MODEL], [f"{MODEL}.max_model_len={MAX_MODEL_LEN}"]) as s:
        yield s


def speak(server, text="Hello there.", sampling=None, timeout=90, **values) -> list[tuple[bytes, int, str]]:
    tensors = {"text": (text, "BYTES"), "sampling_parameters": (sampling, "BYTES")}
    tensors.update({k: (v, DTYPES.get(k, "BYTES")) for k, v in values.items()})
    return stream_speech(server, MODEL, tensors, timeout)


def seeded(seed=3, frames=24, **extra):
    return {"seed": seed, "max_tokens": frames, "temperature": 0.8, **extra}


@pytest.mark.server
def test_streamed_chunks_equal_the_non_streamed_audio(server):
    chunks = speak(server, sampling=seeded(), stream=True)
    frames = [len(a) // FRAME_BYTES for a, _, _ in chunks]
    assert frames[0] == 4 and sum(frames) <= 24 and {s for _, s, _ in chunks} == {44100}
    assert chunks[-1][2] in ("length", "stop") and all(r == "" for _, _, r in chunks[:-1])
    streamed = b"".join(a for a, _, _ in chunks)
    (pcm, rate, reason), = speak(server, sampling=seeded(), response_format="pcm")
    assert (rate, reason) == (44100, chunks[-1][2])
    assert pcm == streamed
    assert np.abs(np.frombuffer(pcm, "<i2")).max() > 100          # not silence
    other = speak(server, sampling=seeded(seed=4), response_format="pcm")[0][0]
    assert other != pcm


@pytest.mark.server
def test_a_cloned_voice_streams_the_non_streamed_audio(server):
    clone = {"reference_audio": CLIP, "reference_text": CLIP_TEXT}
    chunks = speak(server, sampling=seeded(frames=20), stream=True, **clone)
    assert [len(a) // FRAME_BYTES for a, _, _ in chunks][0] == 4 and chunks[-1][2] in ("length", "stop")
    (pcm, rate, reason), = speak(server, sampling=seeded(frames=20), response_format="pcm", **clone)
    assert (rate, reason) == (44100, chunks[-1][2])
    assert pcm == b"".join(a for a, _, _ in chunks)
    own = speak(server, sampling=seeded(frames=20), response_format="pcm")[0][0]
    assert own != pcm                       # the same seed without the reference: another prompt


@pytest.mark.server
@pytest.mark.parametrize("fmt,rate", [("wav", 44100), ("mp3", 44100), ("opus", 48000), ("flac", 44100)])
def test_files_decode_at_their_rate(server, fmt, rate):
    (data, got_rate, _), = speak(server, sampling=seeded(frames=12), response_format=fmt)
    wave, file_rate = audio.decode(data)
    assert got_rate == file_rate == rate
    (pcm, _, _), = speak(server, sampling=seeded(frames=12), response_format="pcm")
    assert abs(wave.size / rate - len(pcm) / 2 / 44100) < 0.1       # the same audio's length


@pytest.mark.server
def test_wav_equals_the_in_process_talker_and_codec(server, folder):
    from triton_omni.tts.fish.codec import load_codec

    text, frames = "The quick brown fox jumps over the lazy dog.", 16
    (wav, rate, _), = speak(server, text, {"temperature": 0, "max_tokens": frames}, response_format="wav")
    back, _ = audio.decode(wav)
    got = greedy_frames(folder, text, frames)
    codes = got[:, 1:].T[None]
    want = load_codec(folder / "codec.pth").decode(codes)[0].numpy()   # within context_frames: exact windows
    assert back.shape == want.shape
    s16 = np.rint(want * 32767).clip(-32768, 32767) / 32768
    # the same windows up to float rounding of other lengths' sums: a few s16 steps at most
    assert np.abs(back - s16).max() <= 4 / 32768


@pytest.mark.server
def test_concurrent_streams_are_batched_and_equal_one_by_one(server):
    texts = ["Hello there.", "The quick brown fox", "pack my box", "Numbers 0123"]

    def say(i: int) -> list:
        return speak(server, texts[i], seeded(i, 12), stream=True)

    alone = [say(i) for i in range(len(texts))]

    def together() -> list:
        with ThreadPoolExecutor(len(texts)) as pool:
            return list(pool.map(say, range(len(texts))))

    rounds = rounds_until_batched(server, f"{MODEL}_codec", together)
    assert rounds[-1][2] < rounds[-1][1], rounds[-1][1:]
    audio_of = lambda chunks: (b"".join(a for a, _, _ in chunks), chunks[-1][2])  # noqa: E731
    for got, _, _ in rounds:
        assert [audio_of(c) for c in got] == [audio_of(c) for c in alone]


BAD = [
    ("empty text", {"text": ""}, "field 'text': is empty"),
    ("unknown voice", {"voice": "alloy"}, "field 'voice': unknown voice 'alloy'"),
    ("reference not audio", {"reference_audio": b"RIFF0000WAVEnot really", "reference_text": "Hi."},
     "field 'reference_audio': not a readable audio file"),
    ("reference too short", {"reference_audio": audio.encode(voice_clip(0.3), 24000, "wav"), "reference_text": "Hi."},
     "field 'reference_audio': is too short: 0.30 s; at least 0.5 s"),
    ("no transcript", {"reference_audio": CLIP}, "field 'reference_text': is required with reference_audio"),
    ("transcript alone", {"reference_text": "Hi."}, "field 'reference_audio': is required"),
    ("reference too long for the context", {"reference_audio": audio.encode(voice_clip(12.0, 8000), 8000, "wav"),
                                            "reference_text": "Hi."}, "field 'reference_audio': is too long: with its"),
    ("text too long", {"text": "0 1 2 3 4 5 6 7 8 9 " * 30}, "field 'text': is too long"),
    ("text far too long", {"text": "x" * 5000}, "field 'text': is too long: 5000 characters"),
    ("max_tokens above context", {"sampling": {"max_tokens": 5000}}, "field 'sampling_parameters.max_tokens'"),
    ("bad top_p", {"sampling": {"top_p": 0}}, "field 'sampling_parameters.top_p'"),
    ("stop", {"sampling": {"stop": ["x"]}}, "field 'sampling_parameters.stop'"),
]


@pytest.mark.server
@pytest.mark.parametrize("case,values,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_input_fails_that_request_only(server, case, values, expect):
    error, chunks = fails_beside(lambda: speak(server, **{"text": "Hi.", **values}),
                                 lambda: speak(server, "Hello there.", seeded(frames=8), stream=True))
    assert expect in error, error
    assert chunks[-1][2] in ("length", "stop") and sum(len(a) for a, _, _ in chunks) > 0
