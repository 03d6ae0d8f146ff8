"""Orpheus on a GPU: the Llama talker through the engine's CUDA graphs and Triton kernels equals
transformers; the codec step on CUDA cuts streamed chunks that concatenate to exactly the
non-streamed audio whatever shares its batch, and is close to the CPU decode. Skipped without
CUDA (run on the GPU machine)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.sampling import SamplingParams
from triton_omni.models.registry import load_causal_lm
from triton_omni.runtime.step import StepContext
from triton_omni.tts.orpheus.codec import OrpheusCodec, OrpheusCodecParams
from tests.test_tts_orpheus import as_requests, audio_tokens, talk

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = [[515, 0, 300 + i, 301, 302, 2, 516, 517, 513] for i in range(5)]


def codec(folders, device: str, batch: int) -> OrpheusCodec:
    params = OrpheusCodecParams(checkpoint=str(folders[0]), codec_checkpoint=str(folders[1]), decode_batch=batch)
    return OrpheusCodec(StepContext("orpheus_codec", params, device, folders[0].parent))


@pytest.fixture(scope="module")
def folders(tiny_checkpoints):
    return tiny_checkpoints["orpheus"], tiny_checkpoints["snac_24khz"]


def test_codec_on_gpu(folders):
    gpu, cpu = codec(folders, "cuda:0", 16), codec(folders, "cpu", 4)
    tokens = audio_tokens(7 * 19 + 4, 1, gpu.audio_start)
    streamed = gpu.execute(as_requests(talk(tokens, True, gpu.plan, per=3)))
    whole = gpu.execute(as_requests(talk(tokens, False, gpu.plan)))[0]["waveform"]
    assert np.array_equal(np.concatenate([r["waveform"] for r in streamed]), whole)
    other = as_requests(talk(audio_tokens(7 * 30, 2, gpu.audio_start), True, gpu.plan, per=5))
    mixed = gpu.execute(as_requests(talk(tokens, True, gpu.plan, per=3)) + other)
    assert all(np.array_equal(a["waveform"], b["waveform"]) for a, b in zip(streamed, mixed))
    on_cpu = cpu.execute(as_requests(talk(tokens, False, cpu.plan)))[0]["waveform"]
    assert np.abs(on_cpu - whole).max() < 1e-3


def test_talker_graphs_equal_transformers(folders):
    from transformers import AutoModelForCausalLM

    from triton_omni.kernels import dispatch

    dispatch.enable(True)
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        model = load_causal_lm(folders[0], "cuda", torch.float32)
        cfg = EngineConfig(max_num_seqs=8, max_model_len=256, enforce_eager=eager, cuda_graph_batch_sizes=[1, 2, 4, 8])
        engine = LLMEngine(model, cfg, "cuda", torch.float32, [], model.config.vocab_size)
        assert engine.runner.use_graphs == (not eager)
        outs[eager] = engine.generate(PROMPTS, greedy)
    hf = AutoModelForCausalLM.from_pretrained(folders[0], dtype=torch.float32).cuda().eval()
    for p, ours in zip(PROMPTS, outs[False]):
        ids = torch.tensor([p], device="cuda")
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                          eos_token_id=None, pad_token_id=None)[0, len(p):].tolist()
        assert ours == ref
    assert outs[True] == outs[False]
