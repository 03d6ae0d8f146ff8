"""Fish S2-Pro against the `fish-speech` package on the tiny checkpoint (converters/tiny_fish.py).

The package on PyPI (0.1.0) is the older S1-mini release; S2-Pro exists only as upstream source. What
they share is compared here, fp32 on the CPU, with the package's own classes built at the folder's sizes
(tests/ref/fish_ref.py, run in .venv-fish as a subprocess; skipped, saying so, without that environment):
the dual-AR transformer (slow logits after the prompt and after every frame, fast logits for every
codebook teacher-forced by the frame's codes: S2's tensor renaming and its fast AR reading the slow
model's final-norm output are applied to the package's model, see the script), the codec decoder
(DAC.decode of random codes) and encoder (a reference clip resampled by torchaudio and encoded by
DAC.encode: the codes the release puts in a cloning prompt; the codec checkpoint must fill every
parameter of both), and the served pre step's cloning prompt for a WAV clip against the same
parts encoded by the package's ContentSequence.

Not checkable against any installed reference: the layout of S2-Pro's conversation (which parts, in
which order: the package is S1-mini, whose prompt differs; the script lays the parts out as the
upstream generate_long and Conversation do; when this was written, the upstream source's own
generate_long, run by hand with a stub model and the tiny tokenizer, built the same cloning and
plain prompts, but the suite cannot run it), its sampling (top-k / top-p before temperature, the
repetition-aware redraw), the `fish_qwen3_omni` config mapping and the semantic range taken from the
tokenizer: those follow the upstream source (fish_speech/models/text2semantic/inference.py, llama.py,
conversation.py) as read, not as run.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.test_tts_fish import greedy_frames

ROOT = Path(__file__).resolve().parent.parent
REF_PYTHON = Path(os.environ.get("FISH_PYTHON", ROOT / ".venv-fish" / "bin" / "python"))
TEXT = "Hello there, how are you?"
REFERENCE_TEXT = "Pack my box with five dozen jugs."
CLIP_RATE = 16000
pytestmark = pytest.mark.parity


def reference_wav() -> bytes:
    """1.5 s of a voice-like 16 kHz clip (a gliding tone with harmonics, and a little noise) as a WAV."""
    from triton_omni.media import audio

    t = np.arange(int(1.5 * CLIP_RATE)) / CLIP_RATE
    pitch = 2 * np.pi * np.cumsum(140 + 40 * np.sin(2 * np.pi * 1.5 * t)) / CLIP_RATE
    wave = sum(0.2 / k * np.sin(k * pitch) for k in range(1, 6)) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    wave += 0.01 * np.random.default_rng(0).standard_normal(t.size)
    return audio.encode(wave.astype(np.float32), CLIP_RATE, "wav")


def pre_step(folder):
    from triton_omni.runtime.step import StepContext
    from triton_omni.tts.fish.steps import FishPre, FishPreParams

    return FishPre(StepContext("pre", FishPreParams(checkpoint=str(folder)), "cpu", folder.parent))


@pytest.fixture(scope="module")
def folder(tiny_checkpoints):
    return tiny_checkpoints["fish_s2"]


@pytest.fixture(scope="module")
def case(folder, tmp_path_factory):
    from triton_omni.text.tokenizer import load_tokenizer
    from triton_omni.tts.fish.model import prompt_ids

    if not REF_PYTHON.exists():
        pytest.skip(f"reference environment not found ({REF_PYTHON}): run `bash scripts/setup_reference_envs.sh "
                    "fish` to compare against the fish-speech package")
    from triton_omni.media import audio

    frames = greedy_frames(folder, TEXT, 8)
    n = frames.shape[1] - 1
    ids = prompt_ids(load_tokenizer(folder), TEXT, n)
    codes = torch.randint(0, 32, (n, 20), generator=torch.Generator().manual_seed(0))
    clip, _ = audio.decode(reference_wav())                 # the samples the pre step reads from the WAV
    clone_codes = torch.randint(0, 32, (n, 6), generator=torch.Generator().manual_seed(1))
    tmp = tmp_path_factory.mktemp("fish_ref")
    spec = {"prompt": ids.tolist(), "frames": frames.tolist(), "codes": codes.tolist(), "clip": clip.tolist(),
            "clip_rate": CLIP_RATE, "clone": {"text": TEXT, "reference_text": REFERENCE_TEXT,
                                              "codes": clone_codes.tolist()}}
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["HF_HUB_OFFLINE"] = "1"
    run = subprocess.run([str(REF_PYTHON), str(ROOT / "tests" / "ref" / "fish_ref.py"), str(tmp / "spec.json"),
                          str(folder), str(tmp / "ref.npz")], capture_output=True, text=True, timeout=600, env=env,
                         cwd=str(tmp))
    if run.returncode != 0:
        raise RuntimeError(f"reference run failed ({run.returncode}):\n{run.stderr[-4000:]}")
    return spec, dict(np.load(tmp / "ref.npz", allow_pickle=True))


def test_slow_and_fast_logits(folder, case):
    from triton_omni.models.context import ForwardContext
    from triton_omni.tts.fish.model import load_fish
    from triton_omni.tts.qwen3_tts.generate import bind_cache

    spec, ref = case
    model = load_fish(folder)
    ids, frames = torch.tensor(spec["prompt"]), torch.tensor(spec["frames"])
    seq = torch.cat([ids, frames])
    n = len(seq)
    bind_cache(model, 1, n)
    ctx = ForwardContext(is_prefill=True, slot_mapping=torch.arange(n), state_slots=torch.arange(1), seq_lens=[n],
                         cu_seqlens=torch.tensor([0, n]).int())
    with torch.no_grad():
        hidden = model(model.embed(seq), torch.arange(n), ctx)[len(ids) - 1:]
        slow = model.compute_logits(hidden).numpy()
        fast = model.fast_logits(hidden[:len(frames)], frames[:, 1:]).numpy()
    assert slow.shape == ref["slow_logits"].shape and fast.shape == ref["fast_logits"].shape
    print(f"slow logits max abs diff {np.abs(slow - ref['slow_logits']).max():.3g}, "
          f"fast {np.abs(fast - ref['fast_logits']).max():.3g}")
    np.testing.assert_allclose(slow, ref["slow_logits"], atol=1e-4)
    np.testing.assert_allclose(fast, ref["fast_logits"], atol=1e-4)
    # the engine's greedy codes are the reference's fast argmax at every step
    assert (ref["fast_logits"].argmax(-1) == frames[:, 2:].numpy()).all()


def test_codec_decoder(folder, case):
    from triton_omni.tts.fish.codec import load_codec

    spec, ref = case
    # the package keeps its rope tables and masks as state; the release file need not hold them
    assert all(k.endswith(("freqs_cis", "causal_mask")) for k in ref["missing"]), list(ref["missing"])
    wave = load_codec(folder / "codec.pth").decode(torch.tensor(spec["codes"])[None])[0].numpy()
    assert wave.shape == ref["wave"].shape
    print(f"codec max abs diff {np.abs(wave - ref['wave']).max():.3g} (peak {np.abs(ref['wave']).max():.3g})")
    np.testing.assert_allclose(wave, ref["wave"], atol=1e-4)


def test_codec_encoder(folder, case):
    """A clip's codes: media.audio_signal.resample (torchaudio's kernel) + our encoder against torchaudio's
    resample + the package's DAC.encode (encoder, downsample, pre_module, both quantizers)."""
    from triton_omni.media.audio_signal import resample
    from triton_omni.tts.fish.codec import load_codec_encoder

    spec, ref = case
    clip = resample(torch.tensor(spec["clip"], dtype=torch.float32), CLIP_RATE, 44100)
    encoder = load_codec_encoder(folder / "codec.pth")
    codes = encoder.encode(clip).numpy()
    x = torch.nn.functional.pad(clip[None, None], (0, -clip.shape[-1] % encoder.frame_samples))
    with torch.no_grad():
        q = encoder.quantizer
        latent = q.pre_module(q.downsample(encoder.encoder(x)))[0].numpy()
    diff = np.abs(latent - ref["clip_latent"]).max()
    print(f"clip latent max abs diff {diff:.3g} (peak {np.abs(ref['clip_latent']).max():.3g}); codes: "
          f"{codes.shape[1]} frames x {codes.shape[0]} codebooks, {int((codes != ref['clip_codes']).sum())} differ")
    np.testing.assert_allclose(latent, ref["clip_latent"], atol=1e-4)
    np.testing.assert_array_equal(codes, ref["clip_codes"])


def test_clone_prompt(folder, case):
    """The cloning prompt: fish.model.prompt_ids against the package's ContentSequence encoding of the parts,
    and the served pre step (a WAV clip: decode, resample, encode, prompt) against the reference's
    prompt with the reference's codes of that clip."""
    from triton_omni.text.tokenizer import load_tokenizer
    from triton_omni.tts.fish.model import FishConfig, prompt_ids
    from tests.test_tts_omnivoice import request

    spec, ref = case
    tokenizer = load_tokenizer(folder)
    begin = FishConfig.from_folder(folder, tokenizer).semantic_begin
    clone = spec["clone"]
    codes = torch.tensor(clone["codes"])
    ours = prompt_ids(tokenizer, clone["text"], codes.shape[0], (clone["reference_text"], codes), begin)
    np.testing.assert_array_equal(ours.numpy(), ref["clone_prompt"].T)

    served = pre_step(folder).one(request(text=clone["text"], reference_audio=reference_wav(),
                                          reference_text=clone["reference_text"]))["input_ids"]
    clip_codes = torch.from_numpy(ref["clip_codes"])
    want = prompt_ids(tokenizer, clone["text"], codes.shape[0], (clone["reference_text"], clip_codes), begin)
    np.testing.assert_array_equal(served.reshape(want.shape), want.numpy())
