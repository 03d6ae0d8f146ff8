"""Shared fixtures: tiny checkpoints (built once) and real tritonserver instances per test module."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

# Without a GPU the Triton kernels run under the interpreter; it must be chosen before anything
# (transformers, torch._dynamo) imports triton, so here rather than in the kernel tests.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent

TINY = ROOT / "checkpoints" / "tiny"


@pytest.fixture(autouse=True, scope="module")
def _torch_threads_per_module():
    """Each module starts on the process's default number of torch threads: a codec step built in
    the test process takes one thread for the whole process (tts.chunking.bit_stable_on_cpu), and a
    later module that compares its in-process audio with a server's (which runs on the default) then
    differed by an LSB (tests/test_tts_chatterbox.py after tests/test_tts_orpheus.py)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_checkpoints() -> dict[str, Path]:
    """name -> folder of every tiny checkpoint whose builder can run here (a GPU machine may lack the
    reference packages some builders use, e.g. snac; the tests that need those are CPU tests)."""
    from triton_omni.converters.tiny import build, builders

    folders: dict[str, Path] = {}
    for name in builders():
        try:
            folders.update(build(TINY, [name]))
        except ModuleNotFoundError as exc:
            print(f"tiny checkpoint {name} not built: {exc}")
    return folders


@contextlib.contextmanager
def running_server(tmp_path: Path, models: list[str], overrides: list[str] = ()):
    """Build a CPU model repository for `models` (with --set overrides) and serve it."""
    from triton_omni.converters.__main__ import load_configs
    from triton_omni.converters.generate import write_repository
    from triton_omni.launcher.triton import TritonServer

    repo = tmp_path / "model_repository"
    write_repository(load_configs(models, [], list(overrides)), repo, "cpu")
    server = TritonServer(repo, models=models, log_path=tmp_path / "tritonserver.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def step_counts(server, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of one served model, from Triton's statistics API."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    try:
        s = client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()
    return int(s["inference_count"]), int(s["execution_count"])


def rounds_until_batched(server, model: str, send_together, tries: int = 5) -> list[tuple[object, int, int]]:
    """Run `send_together()` (requests sent at once) until `model` ran a round's requests in fewer
    executions than requests, `tries` rounds at most. Dynamic batching is timing: on a loaded machine
    requests sent at once can still reach a step apart, so one round that did not share proves
    nothing, while batching that never happens fails every round. Returns every round run as
    (what send_together returned, inferences, executions); the caller checks each round's results
    and that the last one shared."""
    rounds = []
    for _ in range(tries):
        before = step_counts(server, model)
        results = send_together()
        after = step_counts(server, model)
        rounds.append((results, after[0] - before[0], after[1] - before[1]))
        if rounds[-1][2] < rounds[-1][1]:
            break
    return rounds


def wav_pcm16(wav: bytes) -> tuple[np.ndarray, int]:
    """A 16-bit WAV file's samples as int16 and its rate (the decoder gives s16 / 32768 as floats)."""
    from triton_omni.media import audio

    samples, rate = audio.decode(wav)
    return np.rint(samples * 32768).astype(np.int16), rate


def assert_int16_equal(a, b) -> None:
    """Two int16 sample arrays (or little-endian PCM bytes) of two identical speech requests: bit-equal.
    (They once differed by 1 LSB in ~1 of 3 runs on a loaded CPU: SNAC's rounding depended on torch's
    intra-op thread count, which tts/chunking.bit_stable_on_cpu now fixes at one for such codecs.)"""
    a, b = (np.frombuffer(v, "<i2") if isinstance(v, bytes) else np.asarray(v) for v in (a, b))
    assert a.shape == b.shape, f"{a.shape} samples against {b.shape}"
    diff = np.abs(a.astype(int) - b.astype(int))
    assert diff.max() == 0, (f"{(diff > 0).sum()} of {diff.size} samples differ, by up to {diff.max()}, "
                             f"the first at {np.argmax(diff > 0)}")


def admitted_prompts(engine, prompts: list[list[int]]) -> list:
    """The engine's first prefill step for these prompts, scheduled and admitted (rows, blocks, device
    state) but not run: for tests that drive the runner's prefill paths themselves."""
    from triton_omni.ar.sampling import SamplingParams

    for p in prompts:
        engine.add(p, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    engine._drain_inbox()
    seqs = engine.scheduler.schedule().seqs
    engine.runner.admit(seqs, set())
    return seqs


def prefill_twice(runner, seqs, caches: list[torch.Tensor], second):
    """Fill `caches` with stale values, run the eager prefill (runner.prefill_hidden), keep what it
    left in them, restore the stale values and run `second()` (another prefill path) from them.
    Returns (eager's last hidden states, second()'s result, the caches after eager, the stale caches)."""
    for c in caches:
        c.normal_()
    stale = [c.clone() for c in caches]
    with torch.inference_mode():
        eager = runner.prefill_hidden(seqs).clone()
        after_eager = [c.clone() for c in caches]
        for c, s in zip(caches, stale):
            c.copy_(s)
        result = second()
    return eager, result, after_eager, stale


def speech_fields(raw) -> dict:
    """A pre step's `speech` tensor as a dict, less its `arrival` stamp (checked to be this run's clock)."""
    fields = json.loads(raw)
    arrival = fields.pop("arrival")
    assert abs(time.time() - arrival) < 3600, arrival
    return fields
