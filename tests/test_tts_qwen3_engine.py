"""The Qwen3-TTS talker decoded by the AR engine (a frame model: embeddings in, frames of 16 codes out),
in-process on the CPU with the tiny checkpoint: the engine's frames equal `generate_codes` (the plain
reference loop, itself checked against the qwen-tts package in test_tts_qwen3.py) with requests batched
continuously; EOS and max_tokens end requests from the device step; seeded sampling does not depend
on the batch; the `talker_frames` step streams the same frames."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.sampling import SamplingParams
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request, ResponseSink, StepContext, string_array
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.qwen3_tts.generate import generate_codes
from triton_omni.tts.qwen3_tts.model import assistant_text, load_qwen3_tts, talker_engine
from tests.conftest import speech_fields

CASES = [("The quick brown fox jumps over the lazy dog.", "English", "Ryan", False),   # text streamed per step
         ("Hello there.", "Auto", "vivian", False),
         ("Tell me a story about a robot who learns to paint, slowly.", "German", None, True)]  # all in the prompt
GREEDY = SamplingParams(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def folder(tiny_checkpoints):
    return tiny_checkpoints["qwen3_tts"]


@pytest.fixture(scope="module")
def prompts(folder):
    model, tokenizer = load_qwen3_tts(folder), load_tokenizer(folder)
    with torch.no_grad():
        return [model.build_prompt(tokenizer(assistant_text(t))["input_ids"], lang, spk, non_streaming_mode=ns)
                for t, lang, spk, ns in CASES]


def make_engine(model, **kw):
    return talker_engine(model, EngineConfig(**{"max_num_seqs": 4, "max_model_len": 128, "block_size": 8, **kw}))


def reference(model, prompt, max_frames: int) -> list[list[int]]:
    return generate_codes(model, [prompt], max_frames)[0].tolist()


def test_batched_greedy_frames_equal_generate_codes_one_by_one(folder, prompts):
    assert len({len(p) for p in prompts}) == 3                     # different prompt lengths
    want = [reference(load_qwen3_tts(folder), p, GREEDY.max_tokens) for p in prompts]
    engine = make_engine(load_qwen3_tts(folder))
    seqs = [engine.add(p, GREEDY) for p in prompts[:2]]
    for _ in range(3):
        engine.step()
    seqs.append(engine.add(prompts[2], GREEDY))                    # joins a running batch
    saw_mixed = False
    while engine.has_work():
        engine.step()
        saw_mixed |= len({len(s.output_ids) for s in engine.scheduler.running}) > 1
    assert saw_mixed and engine.stats.max_decode_batch == 3
    for s, w in zip(seqs, want):
        assert len(w) == GREEDY.max_tokens and len({f[0] for f in w}) > 3      # not degenerate
        assert s.output_ids == w and s.finish_reason == "length"
    assert len({tuple(map(tuple, s.output_ids)) for s in seqs}) == 3


def test_eos_and_max_tokens_stop_on_the_device(folder, prompts):
    """The codec head is edited so that EOS wins after a few frames (a real EOS, through the rules'
    min_new_tokens ban and the repetition penalty); requests stop there, or at their max_tokens."""
    free = reference(load_qwen3_tts(folder), prompts[0], GREEDY.max_tokens)

    def eos_model():
        m = load_qwen3_tts(folder)
        w = m.talker.codec_head.weight.data
        w[m.config.codec_eos_token_id] = 1.5 * w[free[3][0]]     # EOS beats what frame 3 picked
        return m

    want = [reference(eos_model(), p, 40) for p in prompts]
    eos = eos_model().config.codec_eos_token_id
    assert all(2 <= len(w) < 40 for w in want) and all(f[0] != eos for w in want for f in w)
    engine = make_engine(eos_model())
    total = len(engine.blocks.free_blocks)
    events = []
    on_output = lambda s, new, reason: events.append((s.seq_id, new, reason))  # noqa: E731
    seqs = [engine.add(p, SamplingParams(max_tokens=40, temperature=0), on_output) for p in prompts]
    short = engine.add(prompts[0], SamplingParams(max_tokens=2, temperature=0), on_output)
    engine.run_until_done()
    for s, w in zip(seqs, want):
        assert s.output_ids == w and s.finish_reason == "stop"
        assert (s.seq_id, [], "stop") in events                    # the EOS frame is not sent
    assert short.output_ids == want[0][:2] and short.finish_reason == "length"
    assert len(engine.blocks.free_blocks) == total and len(engine.blocks.free_slots) == 4


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(folder, prompts):
    engine = make_engine(load_qwen3_tts(folder))
    seeded = SamplingParams(max_tokens=6, temperature=0.9, top_k=50, seed=11)
    alone = engine.generate([prompts[1]], seeded)[0]
    others = [engine.add(prompts[0], SamplingParams(max_tokens=6, temperature=0)),
              engine.add(prompts[2], SamplingParams(max_tokens=5, temperature=1.0, seed=3))]
    engine.step()
    late = engine.add(prompts[1], seeded)                          # joins mid-batch, in another row
    engine.run_until_done()
    assert late.output_ids == alone and len(alone) == 6
    greedy = engine.generate([prompts[1], prompts[0]], SamplingParams(max_tokens=6, temperature=0))
    assert others[0].output_ids == greedy[1]                       # a greedy row stays greedy in a sampled batch
    assert alone != greedy[0]
    assert alone != engine.generate([prompts[1]], SamplingParams(max_tokens=6, temperature=0.9, top_k=50, seed=12))[0]
    assert all(0 <= c < 2048 for f in alone for c in f[1:])


def test_padded_batches_as_in_cuda_graph_buckets(folder, prompts, monkeypatch):
    """What the CUDA-graph buckets replay, run eagerly on the CPU: the first frame (sampled from the
    prompts' hidden states) and the decode steps, 3 rows padded to 4 with the scratch row (whose state
    every padded step writes), give the frames of unpadded decode."""
    from triton_omni.ar.model_runner import GREEDY as GREEDY_VARIANT, ModelRunner

    want = make_engine(load_qwen3_tts(folder)).generate(prompts, GREEDY)
    engine = make_engine(load_qwen3_tts(folder), cuda_graph_batch_sizes=[4])
    runner, buckets = engine.runner, []

    class Body:          # the captured step, eager (the torch attention path needs a host bound)
        def __init__(self, bs, variant, first=False):
            self.key = bs, variant, first
            buckets.append(self.key)

        def replay(self):
            runner._graph_body(*self.key, runner.config.max_model_len)      # writes runner.out

    monkeypatch.setattr(ModelRunner, "use_graphs", property(lambda self: True))
    monkeypatch.setattr(runner, "_graph", Body)
    assert engine.generate(prompts, GREEDY) == want
    assert set(buckets) == {(4, GREEDY_VARIANT, False), (4, GREEDY_VARIANT, True)}


# --- the decoupled step ----------------------------------------------------------------------------
class Collect(ResponseSink):
    def __init__(self):
        self.responses, self.done = [], threading.Event()

    def send(self, outputs, final=False):
        self.responses.append((outputs, final))
        if final:
            self.done.set()


def test_talker_frames_step_streams_the_engine_frames(folder, prompts):
    from triton_omni.tts.frame_talker import TalkerFramesParams
    from triton_omni.tts.qwen3_tts.talker import TalkerFrames

    tokenizer = load_tokenizer(folder)
    params = TalkerFramesParams(checkpoint=str(folder), max_num_seqs=4, max_model_len=128, block_size=8)
    step = TalkerFrames(StepContext("qwen3_tts_talker", params, "cpu", folder.parent))
    try:
        def request(i: int, stream: bool, **extra):
            text, lang, spk, ns = CASES[i]
            tensors = {"input_ids": np.asarray(tokenizer(assistant_text(text))["input_ids"], np.int32),
                       "language": string_array(lang), "non_streaming": np.asarray([ns]),
                       "sampling": string_array(json.dumps({"max_tokens": 7, "temperature": 0})),
                       "stream": np.asarray([stream])}
            if spk:
                tensors["speaker"] = string_array(spk)
            return Request({**tensors, **extra}, request_id=f"r{i}")

        sinks = [Collect(), Collect()]
        step.submit(request(0, True), sinks[0])
        step.submit(request(2, False), sinks[1])
        for sink in sinks:
            assert sink.done.wait(120)
        want = [reference(load_qwen3_tts(folder), prompts[i], 7) for i in (0, 2)]
        streamed, whole = sinks[0].responses, sinks[1].responses
        assert len(streamed) > 1 and len(whole) == 1 and whole[0][1]
        assert np.concatenate([o["codes"] for o, _ in streamed]).tolist() == want[0]
        assert whole[0][0]["codes"].tolist() == want[1]
        for responses in sinks:
            last = responses.responses[-1][0]
            assert last["finish_reason"][0] == b"length" and int(last["completion_tokens"][0]) == 7
            assert speech_fields(last["speech"][0]) == {"seed": 0, "response_format": "mp3", "stream": False}
        with pytest.raises(InvalidInput, match="speaker"):
            step.submit(request(0, True, speaker=string_array("nobody")), Collect())
        with pytest.raises(InvalidInput, match="repetition_penalty"):
            step.submit(request(0, True, sampling=string_array('{"repetition_penalty": -1}')), Collect())
    finally:
        step.close()
