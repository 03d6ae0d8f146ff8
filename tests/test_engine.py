"""The AR engine in-process on the tiny Qwen3: parity with transformers, continuous batching,
aborts, resources returned."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.sampling import SamplingParams
from triton_omni.models.registry import load_causal_lm
from triton_omni.runtime.errors import InvalidInput
from tests.conftest import admitted_prompts, prefill_twice

PROMPTS = [[5, 6, 7, 8, 9], [40, 41], [100 + i for i in range(30)], [7] * 12, [300, 200, 100]]


@pytest.fixture(scope="module")
def folder(tiny_checkpoints):
    return tiny_checkpoints["qwen3"]


@pytest.fixture(scope="module")
def hf(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).eval()


def make_engine(folder, **kw) -> LLMEngine:
    model = load_causal_lm(folder, "cpu", torch.float32)
    config = EngineConfig(**{"max_num_seqs": 8, "max_model_len": 256, **kw})
    return LLMEngine(model, config, "cpu", torch.float32, eos_token_ids=[], vocab_size=model.config.vocab_size)


def hf_greedy(hf, prompt, n):
    ids = torch.tensor([prompt])
    return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                       eos_token_id=None, pad_token_id=None)[0, len(prompt):].tolist()


@pytest.mark.parity
def test_prefill_logits_match_transformers(folder, hf):
    engine = make_engine(folder)
    seqs = [engine.add(p, SamplingParams(max_tokens=1)) for p in PROMPTS]
    engine._drain_inbox()
    batch = engine.scheduler.schedule()
    with torch.inference_mode():
        ours = engine.runner.prefill_logits(batch.seqs, all_tokens=True)
    start = 0
    for s in seqs:
        with torch.no_grad():
            ref = hf(torch.tensor([s.prompt_ids])).logits[0]
        n = len(s.prompt_ids)
        torch.testing.assert_close(ours[start:start + n], ref, atol=1e-4, rtol=1e-4)
        start += n


@pytest.mark.parity
def test_batched_greedy_equals_transformers_one_by_one(folder, hf):
    engine = make_engine(folder)
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    for p, o in zip(PROMPTS, outs):
        assert o == hf_greedy(hf, p, 20)
    assert len({tuple(o) for o in outs}) == len(PROMPTS)      # the outputs are not degenerate


def test_requests_join_and_leave_a_running_batch(folder):
    engine = make_engine(folder, max_num_seqs=3)
    params = [SamplingParams(max_tokens=6 + 4 * i, temperature=0.8, top_p=0.95, seed=3, ignore_eos=True)
              for i in range(len(PROMPTS))]
    alone = [engine.generate([p], q)[0] for p, q in zip(PROMPTS, params)]
    # now all at once with only 3 slots: later ones wait, then join while others are mid-decode
    seqs = [engine.add(p, q) for p, q in zip(PROMPTS, params)]
    saw_mixed = False
    while engine.has_work():
        engine.step()
        lens = {len(s.output_ids) for s in engine.scheduler.running}
        saw_mixed |= len(lens) > 1
        assert len(engine.scheduler.running) <= 3
    assert [s.output_ids for s in seqs] == alone
    assert saw_mixed, "no step decoded sequences of different ages together"
    assert engine.stats.max_decode_batch == 3


def test_abort_frees_blocks_and_slots(folder):
    engine = make_engine(folder, max_num_seqs=2)
    total = len(engine.blocks.free_blocks)
    events = []
    a = engine.add(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True), lambda s, n, r: events.append((s.seq_id, r)))
    engine.add(PROMPTS[1], SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort(a)
    engine.step()
    assert (a.seq_id, "abort") in events and a.finish_reason == "abort"
    assert len(engine.scheduler.running) == 1
    c = engine.add(PROMPTS[2], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.run_until_done()
    assert len(c.output_ids) == 3
    assert len(engine.blocks.free_blocks) == total and len(engine.blocks.free_slots) == 2


def test_stop_tokens_and_eos(folder):
    engine = make_engine(folder)
    free = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0]
    stop_at = free[4]
    out = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[stop_at]))[0]
    assert out == free[:free.index(stop_at)]
    held = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[stop_at],
                                                        min_tokens=6))[0]
    later = [i for i, t in enumerate(free) if t == stop_at and i >= 6]
    assert held == free[:later[0]] if later else held == free     # a stop token counts from min_tokens on
    engine.eos_token_ids = {stop_at}      # read when a request is admitted
    seq = engine.add(PROMPTS[0], SamplingParams(max_tokens=10, temperature=0))
    engine.run_until_done()
    assert seq.output_ids == free[:free.index(stop_at)] and seq.finish_reason == "stop"


def test_bad_requests_are_refused_up_front(folder):
    engine = make_engine(folder, max_model_len=64)
    with pytest.raises(InvalidInput, match="input_ids"):
        engine.add([1, 10 ** 6], SamplingParams())
    with pytest.raises(InvalidInput, match="input_ids"):
        engine.add(np.array([3, -1], dtype=np.int32), SamplingParams())     # as the AR step passes them
    with pytest.raises(InvalidInput, match="field 'prompt'"):
        engine.add([1] * 64, SamplingParams())
    with pytest.raises(InvalidInput, match="max_tokens"):
        engine.add([1] * 10, SamplingParams(max_tokens=60))
    assert not engine.has_work()


def test_padding_rows_never_advance(folder):
    """CUDA-graph buckets pad a batch with the scratch row; its position must stay put, or after
    max_model_len padded steps its block index runs past the block table (a device fault on the GPU)."""
    from triton_omni.ar.model_runner import GREEDY

    runner = make_engine(folder, max_model_len=32).runner
    runner.rows.fill_(runner.scratch)
    with torch.inference_mode():
        for _ in range(40):                                  # more steps than a 32-token context has
            runner._decode_body(2, GREEDY, 0)
    assert runner.position[runner.scratch].item() == 0


def test_prefill_graph_inputs_pack_prompts_then_padding(folder):
    """A prefill graph's static inputs: the prompts packed from token 0 (ids, positions, cache slots
    from their block tables), then padding up to the bucket (slot -1: never written). cu_seqlens: the
    prompts, then empty sequences up to max_num_seqs, then the padding as the last sequence; `last`
    points at each prompt's final token; the state rows are the prompts', then the scratch row."""
    engine = make_engine(folder, block_size=4)
    for p in ([5, 6, 7, 8, 9], [40, 41]):
        engine.add(p, SamplingParams(max_tokens=4))
    engine._drain_inbox()
    seqs = engine.scheduler.schedule().seqs
    runner, t = engine.runner, 16
    S = runner.config.max_num_seqs
    meta = runner._prefill_inputs(seqs, t)
    ids, pos, slots, last, cu, rows = runner._prefill_layout(meta, t)
    assert ids[:7].tolist() == [5, 6, 7, 8, 9, 40, 41] and pos[:7].tolist() == [0, 1, 2, 3, 4, 0, 1]
    b0, b1 = seqs[0].block_table, seqs[1].block_table
    assert slots[:7].tolist() == [b0[0] * 4, b0[0] * 4 + 1, b0[0] * 4 + 2, b0[0] * 4 + 3, b0[1] * 4, b1[0] * 4, b1[0] * 4 + 1]
    assert (slots[7:] == -1).all() and len(meta) == 3 * t + 3 * S + 2
    assert last[:2].tolist() == [4, 6] and cu.tolist() == [0, 5, 7] + [7] * (S - 2) + [t]
    assert rows.tolist() == [seqs[0].row, seqs[1].row] + [runner.scratch] * (S - 2)


def test_prefill_graph_body_equals_eager_prefill(folder):
    """What a prefill graph computes, run eagerly: 3 prompts (37 tokens) in the 64-token bucket (27
    padding tokens, 5 empty sequences) give prefill_hidden's last hidden states and the same cache
    rows, and write no other cache row."""
    engine = make_engine(folder, cuda_graph_prefill_tokens=[16, 64])
    seqs, runner = admitted_prompts(engine, PROMPTS[:3]), engine.runner
    caches = [c for module, _ in runner.layers for c in (module.k_cache, module.v_cache)]
    eager, bucket, after_eager, stale = prefill_twice(runner, seqs, caches, lambda: runner.bucket_prefill_hidden(seqs, 64))
    torch.testing.assert_close(bucket, eager, atol=1e-5, rtol=1e-5)
    for c, e, s in zip(caches, after_eager, stale):
        assert not torch.equal(e, s)
        torch.testing.assert_close(c, e, atol=1e-5, rtol=1e-5)     # the prompts' rows; no others written


def test_prefill_graphs_reach_the_largest_step_and_no_further():
    """Prefill buckets are captured up to the first that holds the largest step the scheduler can form
    (its token budget, or one prompt of max_model_len): a longer list costs no capture or memory."""
    buckets = [16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768]
    sizes = lambda **kw: EngineConfig(cuda_graph_prefill_tokens=buckets, **kw).prefill_graph_sizes()  # noqa: E731
    assert sizes(max_num_batched_tokens=8192, max_model_len=2048) == buckets[:7]
    assert sizes(max_num_batched_tokens=5000, max_model_len=2048) == buckets[:7]
    assert sizes(max_num_batched_tokens=512, max_model_len=20000) == buckets
    assert sizes(max_num_batched_tokens=100, max_model_len=50) == [16, 64, 256]
    assert EngineConfig(cuda_graph_prefill_tokens=[64, 16, 0]).prefill_graph_sizes() == [16, 64]


def test_one_abort_request_names_several_streams():
    """The front aborts a round's cancelled streams with one request: their ids joined by ","."""
    from types import SimpleNamespace

    from triton_omni.ar.step import ARDecode
    from triton_omni.runtime.front import ABORT_INPUT
    from triton_omni.runtime.step import Request, string_array

    aborted, answers = [], []
    step = SimpleNamespace(_abort=aborted.append)
    sink = SimpleNamespace(send=lambda outputs, final=False: answers.append(final))
    request = Request({ABORT_INPUT: string_array("a1,b2,c3")})
    assert ARDecode.handle_abort(step, request, sink)
    assert aborted == ["a1", "b2", "c3"] and answers == [True]
    assert not ARDecode.handle_abort(step, Request({}), sink)


def test_auto_stream_interval_sends_the_first_tokens_at_once_then_groups_by_load():
    """stream_interval 0: a stream's first released tokens go out at once (time to first token); later
    responses carry 1 + one token per STREAMS_PER_TOKEN live streams; the last one whatever is left."""
    import threading
    from types import SimpleNamespace

    from triton_omni.ar.request_metrics import ARRequestMetrics
    from triton_omni.ar.step import STREAMS_PER_TOKEN, ARDecode, ARParams, Reply
    from triton_omni.text.stream import TokenStream

    step = object.__new__(ARDecode)
    step.params, step.live_lock, step.requests_finished = ARParams(stream_interval=0), threading.Lock(), 0
    step.request_metrics = ARRequestMetrics("test")        # no-ops outside the server
    sent = []

    def reply():
        sink = SimpleNamespace(send=lambda outputs, final=False: sent.append((outputs["token_ids"].tolist(),
                                                                              int(outputs["num_context"][0]), final)))
        return Reply(sink, TokenStream([bytes([97 + i % 26]) for i in range(64)], []), True, 3)

    others = [reply() for _ in range(4 * STREAMS_PER_TOKEN - 1)]
    step.live = set(others)
    r = reply()
    step.live.add(r)                      # 4 * STREAMS_PER_TOKEN live streams: 5 tokens a response
    for t in range(12):
        step._deliver(r, [t], None)
    step._deliver(r, [12], "length")
    assert sent == [([0], 0, False),                                  # at once
                    ([0, 1, 2, 3, 4, 5], 1, False),                   # context [0] + 5 new
                    ([2, 3, 4, 5, 6, 7, 8, 9, 10], 4, False),         # 4 tokens of context + 5 new
                    ([7, 8, 9, 10, 11, 12], 4, True)]                 # the rest, final
    assert r not in step.live


def test_step_trace_records_each_step(folder, tmp_path, monkeypatch):
    import json
    import threading

    from triton_omni.ar.engine import EngineThread

    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TRITON_OMNI_ENGINE_TRACE", str(path))
    engine = make_engine(folder)
    loop = EngineThread(engine)
    finished = threading.Semaphore(0)
    seqs = [engine.add(p, SamplingParams(max_tokens=4, ignore_eos=True), lambda s, n, r: r and finished.release())
            for p in PROMPTS[:2]]
    assert finished.acquire(timeout=60) and finished.acquire(timeout=60)
    loop.stop()
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(len(s.output_ids) == 4 for s in seqs)
    prefills = [s for s in steps if s["kind"] == "prefill"]
    assert sum(s["rows"] for s in prefills) == 2
    assert sum(s["tokens"] for s in prefills) == len(PROMPTS[0]) + len(PROMPTS[1])
    assert sorted(a for s in steps for a in s["arrivals"]) == sorted(s.arrival for s in seqs)
    # 4 tokens each: the first from prefill, 3 decode steps (fewer if a prefill held one of them back)
    assert 3 <= sum(s["kind"] == "decode" for s in steps) <= 6
    assert all(s["launch_ms"] >= 0 and s["collect_ms"] >= 0 for s in steps)


def test_prefill_waits_for_a_burst_to_arrive(folder):
    """With prefill_quiet_ms, prompts that arrive close together are prefilled in one step; the wait
    ends when arrivals pause, at prefill_max_wait_ms after the oldest, or when the step is full."""
    import threading
    import time

    engine = make_engine(folder, prefill_quiet_ms=300, prefill_max_wait_ms=5000)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    first = engine.add(PROMPTS[0], params)
    threading.Timer(0.05, lambda: engine.add(PROMPTS[1], params)).start()
    start = time.monotonic()
    engine.run_until_done()
    assert time.monotonic() - start >= 0.3                       # held until arrivals had paused
    assert engine.stats.prefill_steps == 1 and len(first.output_ids) == 3

    engine._drain_inbox()
    for p in PROMPTS[:2]:
        engine.add(p, params)
    engine._drain_inbox()
    oldest, newest = engine.scheduler.waiting[0], engine.scheduler.waiting[-1]
    now = newest.arrival
    assert engine._prefill_hold(now) == pytest.approx(0.3)
    assert engine._prefill_hold(now + 0.31) == 0                 # quiet long enough
    oldest.arrival, newest.arrival = now - 4.9, now - 0.01       # arrivals kept coming for 4.9 s
    assert engine._prefill_hold(now) == pytest.approx(0.1)       # the oldest's deadline comes first
    engine.scheduler.max_num_seqs = 2
    assert engine._prefill_hold(now) == 0                        # a full step goes at once
