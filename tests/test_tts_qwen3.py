"""Qwen3-TTS (python_backends/tts/qwen3_tts*.py) against the official `qwen-tts` package, on tiny random
checkpoints in the release layout (converters/tiny_qwen3_tts.py; 0.6B-like and 1.7B-like).

The reference pins transformers 4.57, so it lives in its own environment (.venv-qwentts, made by
scripts/setup_reference_envs.sh) and runs as a subprocess: tests/ref/qwen3_tts_ref.py loads the same
folder with the package's classes and writes its outputs to an .npz. Without that environment the
parity tests are skipped (with the reason); the self-consistency tests below them always run.

Compared, fp32 on the CPU: token ids; the prefill embeddings and text stream the package builds
(preset speakers, a dialect speaker, language tags and auto, instructions, streaming and non-streaming
text); the talker's codebook-0 logits over the prompt; the greedy frames of the package's `generate`
(repetition penalty 1.05, its suppressed ids and min_new_tokens), alone and as a left-padded batch;
the code predictor's logits; the speech tokenizer's waveform (utterances of different lengths, and one
past 300 frames, where the package decodes in chunks).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from triton_omni.converters.tiny import build
from triton_omni.converters.tiny_qwen3_tts import BUILDERS
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.qwen3_tts.codec import load_codec
from triton_omni.tts.qwen3_tts.generate import bind_cache, generate_codes, prefill
from triton_omni.tts.qwen3_tts.model import Qwen3TTS, SubtalkerSampler, assistant_text, instruct_text, load_qwen3_tts

ROOT = Path(__file__).resolve().parent.parent
REF_PYTHON = Path(os.environ.get("QWEN_TTS_PYTHON", ROOT / ".venv-qwentts" / "bin" / "python"))
VARIANTS = ["qwen3_tts", "qwen3_tts_1b7"]
MAX_NEW_TOKENS = 16                       # the package returns MAX_NEW_TOKENS - 1 frames (no EOS)

CASES = [
    {"text": "The quick brown fox jumps over the lazy dog.", "language": "English", "speaker": "Ryan",
     "non_streaming": False},
    {"text": "Write a haiku about the sea.", "language": "Chinese", "speaker": "Eric", "non_streaming": True},
    {"text": "Hello there.", "language": "Auto", "speaker": "vivian", "instruct": "Speak slowly and warmly.",
     "non_streaming": False},
    {"text": "Numbers 0123456789 and punctuation.", "language": "auto", "speaker": "Dylan", "non_streaming": True},
    {"text": "Tell me a story about a robot who learns to paint.", "language": "German", "speaker": None,
     "instruct": "A deep, calm voice.", "non_streaming": False},
]
BATCH = [0, 2, 4]                         # generated together (the package batches one text mode at a time)


def _random_codes(frames: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (frames, 16), generator=g).tolist()


CODEC_CODES = {"pair": [_random_codes(40, 1), _random_codes(25, 2)], "long": [_random_codes(330, 3)]}


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    return build(ROOT / "checkpoints" / "tiny", list(BUILDERS))


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request, folders):
    folder = folders[request.param]
    return folder, load_qwen3_tts(folder), load_tokenizer(folder)


@pytest.fixture(scope="module")
def codec(folders):
    return load_codec(folders["qwen3_tts"])


@pytest.fixture(scope="module")
def references(folders, tmp_path_factory) -> dict[str, dict[str, np.ndarray]]:
    """The package's outputs for every variant, from one run of the reference environment."""
    if not REF_PYTHON.exists():
        pytest.skip(f"reference environment not found ({REF_PYTHON}): run `bash scripts/setup_reference_envs.sh "
                    "qwen-tts` to compare against the official qwen-tts package")
    tmp = tmp_path_factory.mktemp("qwen3_tts_ref")
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"cases": CASES, "max_new_tokens": MAX_NEW_TOKENS, "batch": BATCH,
                                "codes": CODEC_CODES}))
    pairs = [str(x) for name in VARIANTS for x in (folders[name], tmp / f"{name}.npz")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    run = subprocess.run([str(REF_PYTHON), str(ROOT / "tests" / "ref" / "qwen3_tts_ref.py"), str(spec), *pairs],
                         capture_output=True, text=True, timeout=1200, env=env, cwd=str(tmp))
    if run.returncode != 0:
        raise RuntimeError(f"reference run failed ({run.returncode}):\n{run.stderr[-4000:]}")
    return {name: dict(np.load(tmp / f"{name}.npz")) for name in VARIANTS}


@pytest.fixture(scope="module")
def ref(variant, references):
    return references[variant[0].name]


def _prompt(model: Qwen3TTS, tokenizer, case: dict):
    ids = tokenizer(assistant_text(case["text"]))["input_ids"]
    instruct = tokenizer(instruct_text(case["instruct"]))["input_ids"] if case.get("instruct") else None
    return ids, instruct, model.build_prompt(ids, case["language"], case.get("speaker"), instruct, case["non_streaming"])


# --- parity with the package --------------------------------------------------------------------
@pytest.mark.parity
def test_token_ids_and_prompt_embeddings(variant, ref):
    _, model, tokenizer = variant
    for i, case in enumerate(CASES):
        ids, instruct, prompt = _prompt(model, tokenizer, case)
        assert ids == ref[f"{i}.ids"].tolist()
        assert (instruct or []) == ref[f"{i}.instruct_ids"].tolist()
        for name, ours in (("embeds", prompt.embeds), ("trailing", prompt.trailing), ("pad", prompt.pad)):
            want = torch.from_numpy(ref[f"{i}.{name}"])
            assert ours.shape == want.shape, (i, name)
            torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5, msg=f"case {i} {name}")


@pytest.mark.parity
def test_talker_logits_over_the_prompt(variant, ref):
    _, model, tokenizer = variant
    for i, case in enumerate(CASES):
        prompt = _prompt(model, tokenizer, case)[2]
        bind_cache(model, 1, prompt.embeds.shape[0])
        with torch.no_grad():
            logits = model.compute_logits(prefill(model, [prompt], prompt.embeds.shape[0]))
        want = torch.from_numpy(ref[f"{i}.logits"])
        assert want.abs().max() > 1.0                       # the weights say something
        torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4, msg=f"case {i}")


@pytest.mark.parity
def test_greedy_frames_equal_the_package(variant, ref):
    _, model, tokenizer = variant
    for i, case in enumerate(CASES):
        prompt = _prompt(model, tokenizer, case)[2]
        frames = generate_codes(model, [prompt], MAX_NEW_TOKENS - 1)[0]
        want = torch.from_numpy(ref[f"{i}.codes"])
        assert want.shape == (MAX_NEW_TOKENS - 1, 16)
        assert len(set(want[:, 0].tolist())) > 3            # not one code repeated
        assert torch.equal(frames, want), f"case {i}:\n{frames[:, :4]}\n{want[:, :4]}"


@pytest.mark.parity
def test_batched_generation_equals_the_package_batch(variant, ref):
    _, model, tokenizer = variant
    prompts = [_prompt(model, tokenizer, CASES[i])[2] for i in BATCH]
    for j, frames in enumerate(generate_codes(model, prompts, MAX_NEW_TOKENS - 1)):
        assert torch.equal(frames, torch.from_numpy(ref[f"batch.{j}.codes"])), f"row {j}"


@pytest.mark.parity
def test_code_predictor_logits(variant, ref):
    _, model, _ = variant
    for i in range(len(CASES)):
        hidden, codes = torch.from_numpy(ref[f"{i}.hidden"]), torch.from_numpy(ref[f"{i}.codes"])
        with torch.no_grad():
            logits = model.predictor_logits(hidden, codes)
        torch.testing.assert_close(logits, torch.from_numpy(ref[f"{i}.predictor_logits"]), atol=1e-4, rtol=1e-4)
        # and greedy prediction from the package's hidden states gives the package's codes
        assert torch.equal(model.predict_codes(hidden, codes[:, 0]), codes)


@pytest.mark.parity
def test_codec_waveform(codec, references):
    ref = references["qwen3_tts"]
    assert int(ref["sample_rate"]) == codec.sample_rate == 24000
    for i in range(len(CASES)):                                  # the frames generated above
        codes = torch.from_numpy(ref[f"{i}.codes"])[None]
        wave = codec.decode(codes)[0]
        want = torch.from_numpy(ref[f"{i}.wave"])
        assert wave.shape == want.shape == (codes.shape[1] * 1920,)
        assert (wave - want).abs().max() < 1e-4
    for name, arrays in CODEC_CODES.items():                     # a padded batch; one past a 300-frame chunk
        lengths = [len(a) for a in arrays]
        codes = torch.full((len(arrays), max(lengths), 16), -1, dtype=torch.long)
        for j, a in enumerate(arrays):
            codes[j, :len(a)] = torch.tensor(a)
        for j, wave in enumerate(codec.decode(codes)):
            want = torch.from_numpy(ref[f"codec.{name}.{j}"])
            assert wave.shape == want.shape == (lengths[j] * 1920,)
            assert want.std() > 0.05 and (want.abs() >= 1).float().mean() < 0.01       # audible, not clipped
            assert (wave - want).abs().max() < 1e-4, (name, j, (wave - want).abs().max())


# --- self-consistency (no reference needed) ---------------------------------------------------------
def test_release_layout_loads(folders):
    """Every tensor of the folder has its place (the loader is strict both ways), fused q/k/v and gate/up
    included; the codec skips only the encoder side."""
    from safetensors import safe_open

    for name in VARIANTS:
        model = load_qwen3_tts(folders[name])
        with safe_open(str(folders[name] / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
        assert "talker.model.layers.0.self_attn.q_proj.weight" in keys
        assert any(k.startswith("talker.code_predictor.lm_head.") for k in keys)
        has_proj = "talker.code_predictor.small_to_mtp_projection.weight" in keys
        assert has_proj == (name == "qwen3_tts_1b7")
        assert model.num_code_groups == 16 and model.codebook_size == 2048
        # the engine binds and sizes paged caches only for the talker's layers, not the predictor's
        from triton_omni.ar.model_runner import cache_layers

        assert len(cache_layers(model)) == model.config.talker.num_hidden_layers
    with safe_open(str(folders["qwen3_tts"] / "speech_tokenizer" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert any(k.startswith("encoder.encoder.") for k in keys) and any(k.startswith("decoder.") for k in keys)
    assert load_codec(folders["qwen3_tts"]).frame_samples == 1920


def test_predict_codes_is_row_independent(variant):
    """A row's frame does not depend on what else is in the batch (the engine batches requests)."""
    _, model, _ = variant
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(5, model.config.talker.hidden_size, generator=g)
    code0 = torch.randint(0, 2048, (5,), generator=g)
    together = model.predict_codes(hidden, code0)
    assert together.shape == (5, 16) and torch.equal(together[:, 0], code0)
    assert (together[:, 1:] < 2048).all()
    for r in range(5):
        assert torch.equal(model.predict_codes(hidden[r:r + 1], code0[r:r + 1]), together[r:r + 1])


def test_sampled_frames_are_seeded(variant):
    _, model, tokenizer = variant
    prompt = _prompt(model, tokenizer, CASES[0])[2]

    def run(seed: int):
        t = torch.tensor([0.9])
        k, p, s = torch.tensor([50]), torch.tensor([1.0]), torch.tensor([seed])
        frame = [0]

        def code0(logits, step):
            frame[0] = step
            return SubtalkerSampler(t, k, p, s + 1, torch.tensor([step]), 1)(logits, 0)

        sub = lambda logits, j: SubtalkerSampler(t, k, p, s, torch.tensor([frame[0]]), 16)(logits, j)  # noqa: E731
        return generate_codes(model, [prompt], 8, sample_code0=code0, subtalker=sub)[0]

    a, b, c = run(1), run(1), run(2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape[1] == 16 and (a[:, 1:] < 2048).all()


def test_codec_has_no_lookahead_and_windows_with_its_context_are_exact(codec):
    """Causal: the first e frames decode to the same samples alone as inside a longer utterance; a
    window starting `context_frames()[0]` frames early reproduces its chunk of the whole decode."""
    left, right = codec.context_frames()
    assert right == 0 and left >= 2 * (8 - 1)                  # 2 layers x (sliding window 8 - 1)
    fs = codec.frame_samples
    codes = torch.tensor(_random_codes(left + 30, 7))[None]
    whole = codec.decode_window(codes)
    torch.testing.assert_close(codec.decode_window(codes[:, :20]), whole[:, :20 * fs], atol=1e-5, rtol=0)
    s, e = left + 10, left + 20
    window = codec.decode_window(codes[:, s - left:e])[:, left * fs:]
    torch.testing.assert_close(window, whole[:, s * fs:e * fs], atol=1e-5, rtol=0)
    short = codec.decode_window(codes[:, s - 2:e])[:, 2 * fs:]     # too little context: differs
    assert (short - whole[:, s * fs:e * fs]).abs().max() > 1e-3
