"""Qwen3-TTS on a GPU with the engine's Triton kernels: the code predictor's whole frame (N-1 sub-steps)
captured in one CUDA graph replays exactly as it runs eagerly; talker, predictor and codec agree with
the CPU run. Skipped without CUDA (run on the GPU machine)."""
from __future__ import annotations

import pytest
import torch

from triton_omni.converters.tiny import build
from triton_omni.tts.qwen3_tts.codec import load_codec
from triton_omni.tts.qwen3_tts.generate import bind_cache, prefill
from triton_omni.tts.qwen3_tts.model import assistant_text, load_qwen3_tts
from tests.test_tts_qwen3 import ROOT, VARIANTS, _random_codes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def kernels_on():
    from triton_omni.kernels import dispatch

    was = dispatch.enabled()
    dispatch.enable(True)
    yield
    dispatch.enable(was)


@pytest.fixture(scope="module", params=VARIANTS)
def folder(request):
    return build(ROOT / "checkpoints" / "tiny", [request.param])[request.param]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_predict_codes_in_a_cuda_graph(folder, kernels_on, dtype):
    model = load_qwen3_tts(folder, "cuda", dtype)
    b, h = 8, model.config.talker.hidden_size
    model.reserve(b)                                          # static caches before capture
    hidden = torch.randn(b, h, device="cuda", dtype=dtype)
    code0 = torch.randint(0, 2048, (b,), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                             # warm-up: kernels compiled, tuned
        for _ in range(2):
            model.predict_codes(hidden, code0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model.predict_codes(hidden, code0)
    g = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(3):
        hidden.copy_(torch.randn(b, h, device="cuda", dtype=dtype, generator=g))
        code0.copy_(torch.randint(0, 2048, (b,), device="cuda", generator=g))
        graph.replay()
        assert torch.equal(out, model.predict_codes(hidden, code0))
        assert torch.equal(out[:, 0], code0) and (out[:, 1:] < 2048).all()


def test_matches_the_cpu_run(folder, kernels_on):
    from triton_omni.text.tokenizer import load_tokenizer

    cpu, gpu = load_qwen3_tts(folder), load_qwen3_tts(folder, "cuda", torch.float32)
    ids = load_tokenizer(folder)(assistant_text("The quick brown fox jumps over the lazy dog."))["input_ids"]
    prompts = [m.build_prompt(ids, "english", "ryan") for m in (cpu, gpu)]
    torch.testing.assert_close(prompts[1].embeds.cpu(), prompts[0].embeds, atol=1e-5, rtol=1e-5)
    logits = []
    for m, p in zip((cpu, gpu), prompts):
        n = p.embeds.shape[0]
        bind_cache(m, 1, n)
        with torch.no_grad():
            logits.append(m.compute_logits(prefill(m, [p], n)).cpu())
    torch.testing.assert_close(logits[1], logits[0], atol=2e-3, rtol=2e-3)   # TF32-free fp32 kernels: ~1e-5
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(4, cpu.config.talker.hidden_size, generator=g)
    codes = torch.randint(0, 2048, (4, 16), generator=g)
    with torch.no_grad():
        want = cpu.predictor_logits(hidden, codes)
        got = gpu.predictor_logits(hidden.cuda(), codes.cuda()).cpu()
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def test_codec_on_gpu_matches_cpu(folder, monkeypatch):
    # cuDNN convolutions default to TF32 (2.3e-3 apart from the CPU here, seen on an H200): compare
    # the float32 math itself
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    cpu, gpu = load_codec(folder), load_codec(folder, "cuda")
    codes = torch.tensor([_random_codes(40, 9), _random_codes(40, 10)])
    want = torch.stack(cpu.decode(codes))
    got = torch.stack(gpu.decode(codes.cuda())).cpu()
    assert (got - want).abs().max() < 1e-3


def test_engine_graph_decode_equals_eager_and_one_by_one(folder, kernels_on):
    """The talker on the AR engine (tests/test_tts_qwen3_engine.py on the CPU): the whole frame step
    (rules, code 0, the predictor's 15 sub-steps, next input) replayed as a CUDA graph per batch bucket
    gives the frames of eager decode, for a batch with padding rows and for each request alone."""
    from triton_omni.ar.config import EngineConfig
    from triton_omni.ar.sampling import SamplingParams
    from triton_omni.text.tokenizer import load_tokenizer
    from triton_omni.tts.qwen3_tts.model import talker_engine

    tokenizer = load_tokenizer(folder)
    texts = ["The quick brown fox jumps over the lazy dog.", "Hello there.", "Numbers 0123456789 and punctuation.",
             "Tell me a story about a robot who learns to paint.", "Write a haiku about the sea."]

    def engine(eager: bool):
        model = load_qwen3_tts(folder, "cuda", torch.float32)
        with torch.no_grad():
            prompts = [model.build_prompt(tokenizer(assistant_text(t))["input_ids"], "english", "ryan") for t in texts]
        cfg = EngineConfig(max_num_seqs=8, max_model_len=256, enforce_eager=eager, cuda_graph_batch_sizes=[1, 2, 4, 8])
        e = talker_engine(model, cfg)
        assert e.runner.use_graphs == (not eager)
        return e, prompts

    greedy = SamplingParams(max_tokens=16, temperature=0)
    seeded = SamplingParams(max_tokens=16, temperature=0.9, top_k=50, seed=5)
    for params in (greedy, seeded):
        e, prompts = engine(eager=True)
        eager = e.generate(prompts, params)
        g, prompts = engine(eager=False)
        graphs = g.generate(prompts, params)                     # 5 rows: bucket 8, 3 padding rows
        alone = [g.generate([p], params)[0] for p in prompts]    # bucket 1
        assert graphs == eager == alone
        assert len(g.runner.graphs) >= 2 and all(len(f) == 16 for o in graphs for f in o)


def test_codec_state_pool_graphs_equal_eager(folder):
    """The served codec's calls (StatePool): replayed as CUDA graphs per (rows, frames) they give the
    samples and states of eager calls, for streams interleaved at different points, padded with the
    scratch row, in chunks of the plan's sizes."""
    from triton_omni.tts.qwen3_tts.codec_stream import StatePool, StreamingDecoder

    codec = load_codec(folder, "cuda")
    eager = StatePool(StreamingDecoder(codec.decoder), 4)
    graphs = StatePool(StreamingDecoder(codec.decoder), 4, graph_rows=(1, 2, 4), graph_frames=12)
    g = torch.Generator().manual_seed(7)
    for pool in (eager, graphs):
        for r in range(4):
            pool.reset(r)
    calls = [([0], 3), ([0, 1], 12), ([1, 2, 3, 4], 3), ([2, 0], 12), ([3, 1, 2, 4], 12), ([0], 5), ([3], 20)]
    for rows, t in calls:
        codes = torch.randint(0, 2048, (len(rows), t, codec.num_quantizers), generator=g).cuda()
        want, got = eager.decode(rows, codes), graphs.decode(rows, codes)
        real = [i for i, r in enumerate(rows) if r != 4]
        assert torch.equal(got[real], want[real]), (rows, t)
    assert (4, 12) in graphs.graphs and (1, 20) not in graphs.graphs       # 20 frames: eager
    for a, b in zip(eager.states.tensors(), graphs.states.tensors()):
        assert torch.equal(a[:4], b[:4])
