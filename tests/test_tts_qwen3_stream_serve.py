"""The served Qwen3-TTS codec step with its decoder state (python_backends/tts/qwen3_tts/serve.py), driven
directly on the tiny checkpoint with what the talker's sink sends (no server).

Checked: the talker's sink sends whole chunks of new frames only, a stream id and the first frame's index;
the codec step decodes streams interleaved in Triton batches (at different points, two chunks of one
stream in one batch) to exactly the audio each gets alone and non-streamed (bit for bit: every call is
padded to `decode_batch` rows), within 1e-5 of a whole-utterance decode; an ICL clone's reference frames
prime the state as the package's decode of reference + new frames does; states are freed at the end, on
cancellation, after `stream_idle_s`; `max_streams` caps them; a chunk whose state is gone fails alone.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from triton_omni.converters.tiny import build
from triton_omni.runtime.errors import Unavailable
from triton_omni.runtime.step import Request, ResponseSink, StepContext, string_array
from triton_omni.tts.chunking import ChunkPlan
from triton_omni.tts.qwen3_tts.codec import load_codec
from triton_omni.tts.qwen3_tts.serve import FrameChunkSink, Qwen3TTSCodecParams, Qwen3TTSCodecStep
from triton_omni.tts.request import Speech

ROOT = Path(__file__).resolve().parent.parent
FS = 1920                       # samples per frame


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny decoder's ops are too small to gain from threads (see test_tts_qwen3_codec_stream.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def folder() -> Path:
    return build(ROOT / "checkpoints" / "tiny", ["qwen3_tts"])["qwen3_tts"]


def make_step(folder: Path, **params) -> Qwen3TTSCodecStep:
    return Qwen3TTSCodecStep(StepContext("qwen3_tts_codec", Qwen3TTSCodecParams(checkpoint=str(folder), **params),
                                         "cpu", folder.parent, log=lambda _: None))


@pytest.fixture(scope="module")
def step(folder):
    return make_step(folder)


@pytest.fixture(scope="module")
def codec(folder):
    return load_codec(folder)


def frames(n: int, seed: int) -> np.ndarray:
    return torch.randint(0, 2048, (n, 16), generator=torch.Generator().manual_seed(seed)).numpy().astype(np.int32)


class Collect(ResponseSink):
    def __init__(self):
        self.responses = []

    def send(self, outputs, final=False):
        self.responses.append(outputs)


def talk(codes: np.ndarray, per: int | None, ref: np.ndarray | None = None) -> list[dict]:
    """The talker's responses for `codes` released `per` frames at a time (None: non-streamed, all at
    the end), through its sink."""
    inner = Collect()
    sink = FrameChunkSink(inner, ChunkPlan(3, 12, 0, 0), 16, ref)
    speech = Speech(7, "pcm", per is not None).tensor()
    per = per or len(codes)
    for i in range(0, len(codes), per):
        last = i + per >= len(codes)
        sink.send({"codes": codes[i:i + per], "finish_reason": string_array("length" if last else ""),
                   "speech": speech}, final=last)
    return inner.responses


def run(step, batches: list[list[dict]]) -> list[list]:
    """Each batch through the step (one `execute` each); the results per batch."""
    return [step.execute([Request(dict(r)) for r in batch]) for batch in batches]


def audio(results) -> np.ndarray:
    return np.concatenate([r["waveform"] for r in results])


# --- the talker's sink --------------------------------------------------------------------------
def test_the_talker_sends_whole_chunks_of_new_frames_only():
    codes = frames(40, 1)
    one = talk(codes, 1)
    assert [len(r["codes"]) // 16 for r in one] == [3, 12, 12, 12, 1]
    assert [int(r["first_frame"][0]) for r in one] == [0, 3, 15, 27, 39]
    assert np.array_equal(np.concatenate([r["codes"] for r in one]), codes.reshape(-1))
    assert len({r["stream_id"][0] for r in one}) == 1 and one[0]["stream_id"][0] != talk(codes, 1)[0]["stream_id"][0]
    # released 5 frames at a time: responses at 5, 15 and 30 frames, each up to its last boundary
    # (3, 15, 27); the frames after a boundary wait for the next response
    five = talk(codes, 5)
    assert [(int(r["first_frame"][0]), len(r["codes"]) // 16) for r in five] == [(0, 3), (3, 12), (15, 12), (27, 13)]
    (whole,) = talk(codes, None)
    assert int(whole["first_frame"][0]) == 0 and np.array_equal(whole["codes"], codes.reshape(-1))
    # an ICL clone: the reference's frames lead the first response only, as frames -8..-1
    ref = frames(8, 2)
    primed = talk(codes, 1, ref)
    assert [int(r["first_frame"][0]) for r in primed] == [-8, 3, 15, 27, 39]
    assert np.array_equal(primed[0]["codes"], np.concatenate([ref, codes[:3]]).reshape(-1))


# --- the codec step -------------------------------------------------------------------------------
def test_interleaved_streams_equal_each_alone_and_the_whole_decode(step, codec):
    """Four streams released 1, 2, 5 and 4 frames at a time (the third's last response carries two
    chunks), interleaved so that batches mix streams at different points and hold two consecutive
    responses of one stream."""
    utterances = [frames(n, 10 + i) for i, n in enumerate([40, 17, 29, 3])]
    streams = [talk(u, per) for u, per in zip(utterances, [1, 2, 5, 4])]
    assert [len(s) for s in streams] == [5, 3, 3, 1]
    alone = [audio(r for (r,) in run(step, [[x] for x in s])) for s in streams]
    non_streamed = [run(step, [talk(u, None)])[0][0]["waveform"] for u in utterances]
    order = [[(0, 0), (1, 0), (2, 0)], [(0, 1), (0, 2), (1, 1), (3, 0)], [(2, 1)], [(1, 2), (0, 3), (2, 2), (0, 4)]]
    out = run(step, [[streams[i][j] for i, j in batch] for batch in order])
    got = {i: [] for i in range(len(streams))}
    for batch, results in zip(order, out):
        for (i, _), res in zip(batch, results):
            got[i].append(res["waveform"])
    for i, u in enumerate(utterances):
        wave = np.concatenate(got[i])
        assert wave.shape == (len(u) * FS,)
        assert np.array_equal(wave, alone[i]) and np.array_equal(wave, non_streamed[i]), i
        whole = codec.decode_window(torch.from_numpy(u).long()[None])[0].numpy()
        assert np.abs(wave - whole).max() < 1e-5 and np.abs(whole).max() > 0.01, i
    assert step.streams == {} and len(step.free) == step.params.max_streams      # every state freed at its end


def test_two_chunks_of_one_stream_in_one_batch_decode_in_order(step):
    resp = talk(frames(30, 20), 1)                                 # [0, 3), [3, 15), [15, 27), [27, 30)
    apart = [r for (r,) in run(step, [[x] for x in resp])]
    together = [r for batch in run(step, [resp[:2], resp[2:]]) for r in batch]
    assert [len(r["waveform"]) // FS for r in together] == [3, 12, 12, 3]
    assert all(np.array_equal(x["waveform"], y["waveform"]) for x, y in zip(apart, together))


def test_clone_reference_primes_the_state_as_the_package_decodes(step, codec):
    """The package decodes reference + new frames and cuts the reference's audio: so does the step
    (the reference's frames from a fresh state), streamed and not."""
    ref, u = frames(20, 30), frames(17, 31)
    streamed = run(step, [[x] for x in talk(u, 1, ref)])
    (whole,), = run(step, [talk(u, None, ref)])
    assert [len(r["waveform"]) // FS for (r,) in streamed] == [3, 12, 2]
    assert np.array_equal(audio(r for (r,) in streamed), whole["waveform"])
    both = torch.from_numpy(np.concatenate([ref, u])).long()[None]
    package = codec.decode(both)[0][len(ref) * FS:].numpy()                # the package's chunked_decode
    assert np.abs(whole["waveform"] - package).max() < 1e-5
    unprimed = run(step, [talk(u, None)])[0][0]["waveform"]
    assert np.abs(unprimed - package).max() > 1e-2                          # the reference matters


def test_cancelled_and_idle_streams_lose_their_state_and_later_chunks_fail_alone(folder):
    a, b, c = talk(frames(20, 40), 1), talk(frames(20, 41), 1), talk(frames(20, 42), 1)
    c_alone = run(make_step(folder), [[c[0]]])[0][0]["waveform"]
    step = make_step(folder, stream_idle_s=0.5)
    run(step, [[a[0], b[0]]])
    cancelled = dict(b[1], finish_reason=string_array("cancelled"))
    (res,), = run(step, [[cancelled]])                           # a cancelled stream's last response
    assert res["waveform"].size == 0 and list(step.streams) == [a[0]["stream_id"][0].decode()]
    time.sleep(0.6)                                                # a: idle past stream_idle_s
    late, first = run(step, [[a[1], c[0]]])[0]
    assert isinstance(late, RuntimeError), late
    assert "no decoder state for its chunk from frame 3" in str(late) and "stream_idle_s = 0.5 s" in str(late)
    assert np.array_equal(first["waveform"], c_alone)             # its neighbour in the batch: unaffected
    again = run(step, [[a[2]]])[0][0]                            # a stays gone
    assert isinstance(again, RuntimeError) and "from frame 15" in str(again)


def test_a_repeated_chunk_fails_and_ends_its_stream(step):
    c = talk(frames(20, 43), 1)
    ok = [r for (r,) in run(step, [[c[0]], [c[1]]])]
    assert [len(r["waveform"]) for r in ok] == [3 * FS, 12 * FS]
    (twice,), (after,) = run(step, [[c[1]], [c[2]]])
    assert isinstance(twice, RuntimeError) and "but its decoder state is at frame 15" in str(twice)
    assert isinstance(after, RuntimeError) and "no decoder state for its chunk from frame 15" in str(after)
    assert step.streams == {}


def test_max_streams_caps_live_states(folder):
    step = make_step(folder, max_streams=2)
    a, b, c = talk(frames(16, 50), 1), talk(frames(16, 51), 1), talk(frames(16, 52), 1)
    first = run(step, [[a[0], b[0], c[0]]])[0]
    assert isinstance(first[2], Unavailable) and "all max_streams = 2 decoder states are in use" in str(first[2])
    assert [len(r["waveform"]) for r in first[:2]] == [3 * FS, 3 * FS]
    rest = run(step, [[a[1], b[1]], [a[2]], [c[0]]])            # a ends: its row frees, c can start
    assert [len(r["waveform"]) for batch in rest for r in batch] == [12 * FS, 12 * FS, 1 * FS, 3 * FS]
    assert sorted(step.streams) == sorted(x[0]["stream_id"][0].decode() for x in (b, c))
