"""Higgs Audio understanding against the boson-multimodal package on the tiny random checkpoint (tests/ref/
higgs_ref.py, run in .venv-higgs as a subprocess; skipped, saying so, without that environment): the
checkpoint loads in the package with every parameter found, our pre step's prompt is the package's, our
packed tower's rows are its `_apply_audio_tower`'s for each clip alone (and packed equal alone), and the
whole model's first logits and greedy tokens on our AR engine are the package's."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from triton_omni.runtime.step import Request, StepContext

ROOT = Path(__file__).resolve().parent.parent
REF_PYTHON = Path(os.environ.get("HIGGS_PYTHON", ROOT / ".venv-higgs" / "bin" / "python"))
LENGTHS = (16000, 40000)
STEPS = 6
INSTRUCTION = "What words do you hear from the provided audio? Write it down for me."
pytestmark = pytest.mark.parity


def clips() -> list[np.ndarray]:
    g = np.random.default_rng(7)
    return [(g.standard_normal(n) * (0.05 + 0.3 * np.abs(np.sin(np.arange(n) / 700.0)))).astype(np.float32)
            for n in LENGTHS]


@pytest.fixture(scope="module")
def folder(tiny_checkpoints):
    return tiny_checkpoints["higgs_audio"]


@pytest.fixture(scope="module")
def ref(folder, tmp_path_factory):
    if not REF_PYTHON.exists():
        pytest.skip(f"reference environment not found ({REF_PYTHON}): run `bash scripts/setup_reference_envs.sh higgs` "
                    "to compare against the boson-multimodal package")
    tmp = tmp_path_factory.mktemp("higgs_ref")
    (tmp / "spec.json").write_text(json.dumps({"clips": [c.tolist() for c in clips()], "instruction": INSTRUCTION,
                                               "steps": STEPS}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["HF_HUB_OFFLINE"] = "1"
    run = subprocess.run([str(REF_PYTHON), str(ROOT / "tests" / "ref" / "higgs_ref.py"), str(tmp / "spec.json"),
                          str(folder), str(tmp / "ref.npz")], capture_output=True, text=True, timeout=600, env=env,
                         cwd=str(tmp))
    if run.returncode != 0:
        raise RuntimeError(f"reference run failed ({run.returncode}):\n{run.stderr[-4000:]}")
    return dict(np.load(tmp / "ref.npz"))


def test_tower_rows_equal_the_package_clip_by_clip(folder, ref):
    from triton_omni.asr.higgs_audio.model import HiggsAudioEncoder, audio_tokens

    ours = HiggsAudioEncoder.load(folder)
    batch = [torch.from_numpy(c) for c in clips()]
    with torch.inference_mode():
        packed, counts = ours(batch)
        at = 0
        for i, (clip, n) in enumerate(zip(batch, counts)):
            assert n == audio_tokens(clip.numel()) == ref[f"embeds{i}"].shape[0]
            torch.testing.assert_close(packed[at:at + n], torch.from_numpy(ref[f"embeds{i}"]), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(packed[at:at + n], ours([clip])[0], rtol=1e-5, atol=1e-5)
            at += n


def test_prompt_and_greedy_tokens_equal_the_package(folder, ref):
    """Our pre step writes the package's prompt (its one <|AUDIO|> expanded to the tower's rows), and the
    decoder on our engine, both clips decoded together, gives the package's logits and greedy tokens."""
    from triton_omni.ar.prompt_embeds import PromptEmbeds, placeholder_index
    from triton_omni.ar.sampling import SamplingParams
    from triton_omni.ar.step import ARParams, build_engine
    from triton_omni.asr.higgs_audio.steps import (HiggsAudioEncoderParams, HiggsAudioEncoderStep, HiggsAudioPre,
                                                   HiggsAudioPreParams)
    pre = HiggsAudioPre(StepContext("pre", HiggsAudioPreParams(checkpoint=str(folder), segmentation="window",
                                                               transcribe_prompt=INSTRUCTION), "cpu", Path(".")))
    encoder = HiggsAudioEncoderStep(StepContext("enc", HiggsAudioEncoderParams(checkpoint=str(folder)), "cpu", Path(".")))
    audio_id = pre.audio_token_id
    outs = []
    for i, clip in enumerate(clips()):
        out = pre.one(Request({"audio": np.array([float_wav(clip)], dtype=object)}))
        want = ref[f"prompt{i}"].tolist()
        a = want.index(audio_id)
        n = int(out["prompt_lens"][0]) - (len(want) - 1)
        assert out["input_ids"].tolist() == want[:a] + [audio_id] * n + want[a + 1:]
        outs.append(out)
    rows = encoder.execute([Request(o) for o in outs])
    engine = build_engine(folder, ARParams(checkpoint=str(folder), dtype="float32", max_num_seqs=4, max_model_len=1024),
                          "cpu", prompt_embeds=True)[0]
    seqs = [engine.add(o["input_ids"], SamplingParams(max_tokens=STEPS, temperature=0.0),
                       embeds=PromptEmbeds(torch.from_numpy(r["prompt_embeds"]), placeholder_index(o["input_ids"], [audio_id])))
            for o, r in zip(outs, rows)]
    engine.run_until_done()
    for i, seq in enumerate(seqs):
        assert seq.output_ids == ref[f"tokens{i}"].tolist()
        assert seq.output_ids[:1] == [int(np.argmax(ref[f"logits{i}"]))]


def float_wav(clip: np.ndarray) -> bytes:
    """The samples themselves as a 16 kHz 32-bit float WAV (read exactly, so the reference sees the same clip)."""
    data = clip.astype("<f4").tobytes()
    fmt = (3).to_bytes(2, "little") + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little") \
        + (64000).to_bytes(4, "little") + (4).to_bytes(2, "little") + (32).to_bytes(2, "little")
    return (b"RIFF" + (36 + len(data)).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little") + fmt
            + b"data" + len(data).to_bytes(4, "little") + data)
