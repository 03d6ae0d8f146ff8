"""Qwen3-TTS voice cloning (Base checkpoints): python_backends/tts/qwen3_tts/clone.py and the clone prompt
of Qwen3TTS.build_prompt against the official `qwen-tts` package, then served (`qwen3_tts_base`).

Parity (fp32, CPU; the package runs in .venv-qwentts as tests/ref/qwen3_tts_clone_ref.py, as in
tests/test_tts_qwen3.py), on the tiny Base checkpoint and two synthetic voiced clips: librosa's mel
filters, the log-mel and the x-vector (float tolerance), the speech tokenizer's reference codes (equal),
the token ids, prefill embeddings and text stream of x-vector-only and ICL prompts (streaming and
non-streaming text, a text shorter and longer than the reference), the greedy frames of
`generate_voice_clone` (equal), and its waveform (ICL: the reference's codes decoded before the frames).

Served: a clone request gives a 24 kHz file equal to the in-process encoders + talker + codec; streamed
== non-streamed for the same reference and seed; a bad reference fails its request only, naming the
field; reference audio on the CustomVoice model is refused.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from triton_omni.media import audio
from triton_omni.media.audio_signal import mel_filters
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.qwen3_tts.clone import VoiceCloner, mel_spectrogram
from triton_omni.tts.qwen3_tts.codec import load_codec
from triton_omni.tts.qwen3_tts.generate import generate_codes
from triton_omni.tts.qwen3_tts.model import assistant_text, load_qwen3_tts, reference_text
from tests.conftest import running_server
from tests.test_tts_qwen3_server import audio_s16
from tests.test_tts_server import SpeechError, fails_beside, stream_speech

ROOT = Path(__file__).resolve().parent.parent
REF_PYTHON = Path(os.environ.get("QWEN_TTS_PYTHON", ROOT / ".venv-qwentts" / "bin" / "python"))
MODEL, CUSTOM = "qwen3_tts_base", "qwen3_tts"
FRAMES = 16                       # the package returns max_new_tokens - 1 frames
FRAME_SAMPLES = 1920


def clip(seconds: float, voice: int, rate: int = 24000) -> np.ndarray:
    """A voiced-sounding test clip: a wavering pitch with 5 harmonics, a syllable-rate envelope, a
    little noise; `voice` moves the pitch."""
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 60 * voice + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    wave = sum(0.25 / k * np.sin(k * phase) for k in range(1, 6)) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t) ** 2)
    return (wave + 0.01 * np.random.default_rng(voice).standard_normal(t.size)).astype(np.float32)


CLIPS = {"0": clip(2.0, 0), "1": clip(3.3, 1)}      # 25 and 42 frames (3.3 s: not a whole frame)
CASES = [
    {"text": "The quick brown fox jumps over the lazy dog.", "language": "English", "ref": 0, "ref_text": None,
     "non_streaming": False},
    {"text": "Hello there.", "language": "Auto", "ref": 1, "ref_text": "Pack my box with five dozen liquor jugs.",
     "non_streaming": False},
    {"text": "Tell me a story about a robot who learns to paint, a long one please.", "language": "auto", "ref": 0,
     "ref_text": "Hi.", "non_streaming": False},                  # text outlasts the reference: the rest streams
    {"text": "Hello there.", "language": "German", "ref": 1, "ref_text": "Pack my box.", "non_streaming": True},
    {"text": "Numbers 0123456789.", "language": "Chinese", "ref": 1, "ref_text": None, "non_streaming": True},
]


@pytest.fixture(scope="module")
def folder(tiny_checkpoints) -> Path:
    return tiny_checkpoints[MODEL]


@pytest.fixture(scope="module")
def ours(folder):
    return VoiceCloner(folder), load_qwen3_tts(folder), load_tokenizer(folder)


@pytest.fixture(scope="module")
def ref(folder, tmp_path_factory) -> dict[str, np.ndarray]:
    if not REF_PYTHON.exists():
        pytest.skip(f"reference environment not found ({REF_PYTHON}): run `bash scripts/setup_reference_envs.sh "
                    "qwen-tts` to compare against the official qwen-tts package")
    tmp = tmp_path_factory.mktemp("qwen3_tts_clone_ref")
    (tmp / "spec.json").write_text(json.dumps({"cases": CASES, "max_new_tokens": FRAMES}))
    np.savez(tmp / "clips.npz", **CLIPS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    run = subprocess.run([str(REF_PYTHON), str(ROOT / "tests" / "ref" / "qwen3_tts_clone_ref.py"), "spec.json",
                          "clips.npz", str(folder), "out.npz"], capture_output=True, text=True, timeout=600, env=env,
                         cwd=str(tmp))
    if run.returncode != 0:
        raise RuntimeError(f"reference run failed ({run.returncode}):\n{run.stderr[-4000:]}")
    return dict(np.load(tmp / "out.npz"))


def _prompt(ours, case: dict):
    cloner, model, tokenizer = ours
    wave = CLIPS[str(case["ref"])]
    ids = tokenizer(assistant_text(case["text"]))["input_ids"]
    icl = {}
    if case["ref_text"] is not None:
        icl = {"ref_codes": cloner.codes(wave), "ref_ids": tokenizer(reference_text(case["ref_text"]))["input_ids"]}
    prompt = model.build_prompt(ids, case["language"], None, None, case["non_streaming"],
                                speaker_embed=cloner.x_vector(wave), **icl)
    return ids, icl, prompt


# --- parity with the package ------------------------------------------------------------------------
@pytest.mark.parity
def test_mel_front_end_and_x_vector(ours, ref):
    cloner = ours[0]
    np.testing.assert_allclose(mel_filters(24000, 1024, 128, 0, 12000), ref["mel_basis"], atol=1e-7, rtol=0)
    xvecs = []
    for r, wave in CLIPS.items():
        mel = mel_spectrogram(torch.from_numpy(wave)[None])[0]
        torch.testing.assert_close(mel, torch.from_numpy(ref[f"{r}.mel"]), atol=1e-5, rtol=1e-5)
        xvec = cloner.x_vector(wave)
        assert xvec.shape == (64,)
        torch.testing.assert_close(xvec, torch.from_numpy(ref[f"{r}.xvec"]), atol=1e-5, rtol=1e-5)
        xvecs.append(xvec)
    assert (xvecs[0] - xvecs[1]).abs().max() > 0.05                # the voice matters


@pytest.mark.parity
def test_reference_codes_equal_the_package(ours, ref):
    cloner = ours[0]
    for r, wave in CLIPS.items():
        codes = cloner.codes(wave)
        assert codes.shape == (-(-wave.size // FRAME_SAMPLES), 16)
        assert torch.equal(codes, torch.from_numpy(ref[f"{r}.codes"])), r
        assert len(set(codes[:, 0].tolist())) > 10 and len(set(codes[:, 15].tolist())) > 10   # the audio matters


@pytest.mark.parity
def test_clone_prompt_embeddings(ours, ref):
    for i, case in enumerate(CASES):
        ids, icl, prompt = _prompt(ours, case)
        assert ids == ref[f"case{i}.ids"].tolist()
        assert icl.get("ref_ids", []) == ref[f"case{i}.ref_ids"].tolist()
        for name, got in (("embeds", prompt.embeds), ("trailing", prompt.trailing), ("pad", prompt.pad)):
            want = torch.from_numpy(ref[f"case{i}.{name}"])
            assert got.shape == want.shape, (i, name)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"case {i} {name}")
    # ICL lays the reference's frames into the prompt: 9 positions + bos + one per frame
    assert len(_prompt(ours, CASES[1])[2]) == 3 + 5 + 1 + 42


@pytest.mark.parity
def test_greedy_frames_and_waveform_equal_the_package(ours, ref, folder):
    cloner, model, _ = ours
    codec = load_codec(folder)
    for i, case in enumerate(CASES):
        frames = generate_codes(model, [_prompt(ours, case)[2]], FRAMES - 1)[0]
        want = torch.from_numpy(ref[f"case{i}.frames"])
        assert want.shape == (FRAMES - 1, 16) and len(set(want[:, 0].tolist())) > 5
        assert torch.equal(frames, want), f"case {i}:\n{frames[:, :4]}\n{want[:, :4]}"
        # the package decodes an ICL clone after the reference's codes and cuts the reference off
        ctx = cloner.codes(CLIPS[str(case["ref"])]) if case["ref_text"] is not None else frames[:0]
        wave = codec.decode(torch.cat([ctx, frames])[None])[0][ctx.shape[0] * FRAME_SAMPLES:]
        assert wave.shape == ref[f"case{i}.wave"].shape
        assert (wave - torch.from_numpy(ref[f"case{i}.wave"])).abs().max() < 1e-4, i


def test_base_folder_loads(folder):
    """The talker skips `speaker_encoder.*`; the encoders take every tensor they need (strict loads)."""
    model = load_qwen3_tts(folder)
    assert model.speakers() == [] and model.config.tts_model_type == "base"
    cloner = VoiceCloner(folder)
    assert sum(p.numel() for p in cloner.speaker.parameters()) > 10000
    with pytest.raises(ValueError, match="Base checkpoint"):
        VoiceCloner(folder.parent / CUSTOM)


# --- served -------------------------------------------------------------------------------------------
DTYPES = {"stream": "BOOL"}
MAX_MODEL_LEN = 256
MAX_REFERENCE_SECONDS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    overrides = [f"{MODEL}.max_model_len={MAX_MODEL_LEN}", f"{CUSTOM}.max_model_len={MAX_MODEL_LEN}",
                 f"{MODEL}.pre.max_reference_seconds={MAX_REFERENCE_SECONDS}"]
    with running_server(tmp_path_factory.mktemp("qwen3_tts_clone"), [MODEL, CUSTOM], overrides) as s:
        yield s


def speak(server, text="Hello there.", sampling=None, model=MODEL, timeout=90, **values):
    tensors = {"text": (text, "BYTES"), "sampling_parameters": (sampling, "BYTES")}
    tensors.update({k: (v, DTYPES.get(k, "BYTES")) for k, v in values.items()})
    return stream_speech(server, model, tensors, timeout)


REFERENCE = audio.encode(clip(2.0, 2), 24000, "wav")


@pytest.mark.server
@pytest.mark.parametrize("mode,fmt,rate", [("x-vector", "flac", 16000), ("icl", "wav", 24000)])
def test_cloned_file_equals_the_in_process_pipeline(server, folder, ours, mode, fmt, rate):
    text, frames = "The quick brown fox jumps over the lazy dog.", 16
    upload = audio.encode(clip(1.5, 3, rate), rate, fmt)
    transcript = "Pack my box with five dozen liquor jugs." if mode == "icl" else None
    (wav, sr, reason), = speak(server, text, {"temperature": 0, "max_tokens": frames}, response_format="wav",
                               reference_audio=upload, reference_text=transcript)
    back, wav_rate = audio.decode(wav)
    assert sr == wav_rate == 24000 and reason == "length"

    cloner, model, tokenizer = ours
    wave, _ = audio.decode(upload, 24000)                    # what pre hears: resampled by the same decoder
    icl = {}
    if transcript:
        icl = {"ref_codes": cloner.codes(wave), "ref_ids": tokenizer(reference_text(transcript))["input_ids"]}
    prompt = model.build_prompt(tokenizer(assistant_text(text))["input_ids"], "auto",
                                speaker_embed=cloner.x_vector(wave), **icl)
    codes = generate_codes(model, [prompt], frames)[0]
    assert codes.shape == (frames, 16)
    ctx = icl.get("ref_codes", codes[:0])
    want = load_codec(folder).decode_window(torch.cat([ctx, codes])[None])[0, ctx.shape[0] * FRAME_SAMPLES:].numpy()
    assert back.shape == want.shape == (frames * FRAME_SAMPLES,)
    # the codec decodes the reference's frames (ICL), then each chunk with its state carried over: the
    # whole decode up to float rounding, at most one s16 step apart
    assert np.abs(back - audio_s16(want)).max() <= 1 / 32768
    assert np.abs(want).max() > 0.01


@pytest.mark.server
def test_streamed_equals_non_streamed_for_the_same_reference_and_seed(server):
    sampling = {"seed": 5, "max_tokens": 20}
    kw = {"reference_audio": REFERENCE, "reference_text": "Hello there, this is me."}
    chunks = speak(server, sampling=sampling, stream=True, **kw)
    assert [len(a) // (2 * FRAME_SAMPLES) for a, _, _ in chunks] == [3, 12, 5]
    assert {s for _, s, _ in chunks} == {24000} and chunks[-1][2] == "length"
    (pcm, _, _), = speak(server, sampling=sampling, response_format="pcm", **kw)
    assert pcm == b"".join(a for a, _, _ in chunks)
    assert np.abs(np.frombuffer(pcm, "<i2")).max() > 100
    other = speak(server, sampling=sampling, response_format="pcm", reference_text=kw["reference_text"],
                  reference_audio=audio.encode(clip(2.0, 4), 24000, "wav"))[0][0]
    assert len(other) == len(pcm) and other != pcm                # another voice, another audio


BAD = [
    ("not audio", {"reference_audio": b"RIFF0000WAVEnot really"}, "field 'reference_audio': not a readable audio"),
    ("empty", {"reference_audio": b""}, "field 'reference_audio': is required"),
    ("missing", {}, "field 'reference_audio': is required"),
    ("too short", {"reference_audio": audio.encode(clip(0.2, 0), 24000, "wav")}, "field 'reference_audio': is too short"),
    ("too long", {"reference_audio": audio.encode(clip(MAX_REFERENCE_SECONDS + 1, 0), 24000, "wav")},
     "field 'reference_audio': is too long"),
    ("preset voice", {"reference_audio": REFERENCE, "voice": "vivian"}, "field 'voice': this model has no preset voices"),
]


@pytest.mark.server
@pytest.mark.parametrize("case,values,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_reference_fails_that_request_only(server, case, values, expect):
    error, chunks = fails_beside(lambda: speak(server, "Hi.", **values),
                                 lambda: speak(server, "Hello there.", {"seed": 1, "max_tokens": 8}, stream=True,
                                               reference_audio=REFERENCE))
    assert expect in error, error
    assert chunks[-1][2] == "length" and sum(len(a) for a, _, _ in chunks) == 8 * 2 * FRAME_SAMPLES


@pytest.mark.server
@pytest.mark.parametrize("field", ["reference_audio", "reference_text"])
def test_custom_voice_model_refuses_a_reference(server, field):
    with pytest.raises(SpeechError) as err:
        speak(server, model=CUSTOM, voice="ryan", **{field: REFERENCE if field == "reference_audio" else "Hi."})
    assert f"field '{field}': this model does not clone voices" in str(err.value), str(err.value)
    (pcm, _, reason), = speak(server, model=CUSTOM, voice="ryan", sampling={"max_tokens": 4}, response_format="pcm")
    assert reason == "length" and len(pcm) == 4 * 2 * FRAME_SAMPLES
