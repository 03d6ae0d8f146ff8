"""Chatterbox (python_backends/tts/chatterbox*.py) against the official `chatterbox-tts` package on a tiny
random checkpoint in the release layout (converters/tiny_chatterbox.py), and the served `chatterbox_tts`
ensemble on a live tritonserver.

The reference runs in its own environment (.venv-chatterbox, made by scripts/setup_reference_envs.sh) as a
subprocess: tests/ref/chatterbox_ref.py builds the package's classes at the folder's sizes, loads the
folder as ChatterboxTTS.from_local does and runs generate() (with torch.manual_seed(seed) before it and
again before S3Gen) and S3Gen alone, writing an .npz. Without that environment the parity tests are
skipped (with the reason); the others always run.

Compared, fp32 on the CPU: the text ids, T3's cond / uncond logits at every decode step, T3's tokens
(sampled with the package's defaults, sampled with top-p / min-p, and greedy: the package with min_p = 1),
S3Gen's mel and waveform for T3's tokens and for given tokens (same seed, same noise), and the whole
in-process pipeline (pre -> t3 -> s3gen steps) against generate()'s waveform before its watermark.

Voice cloning (python_backends/tts/chatterbox/voice.py) against prepare_conditionals on one 10.5 s clip
(both the 10 s and the 6 s cuts apply): S3Gen's reference (tokens, mel, x-vector), T3's conditioning from
the same 16 kHz clip, the resampling differences that remain (librosa's soxr, which we do not have), and
generate(text, audio_prompt_path=...) end to end given librosa's 16 kHz clip.
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
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request, StepContext
from triton_omni.tts.chatterbox.s3gen import S3Gen
from triton_omni.tts.chatterbox.steps import (ChatterboxPre, ChatterboxPreParams, ChatterboxS3Gen,
                                              ChatterboxS3GenParams, ChatterboxT3, ChatterboxT3Params)
from triton_omni.tts.chatterbox.t3 import T3, Sampling, T3Job, TextTokenizer, generate_tokens, load_voice, \
    normalize_text
from triton_omni.tts.chatterbox.voice import VoiceCloner, ffmpeg_resample, resample
from tests.conftest import TINY, assert_int16_equal, running_server, speech_fields, wav_pcm16
from tests.test_tts_orpheus import speech_request
from tests.test_tts_server import fails_beside, stream_speech

ROOT = Path(__file__).resolve().parent.parent
REF_PYTHON = Path(os.environ.get("CHATTERBOX_PYTHON", ROOT / ".venv-chatterbox" / "bin" / "python"))
RATE = 24000
CASES = [
    {"text": "Hello there, how are you today?", "seed": 3, "max_new_tokens": 24},
    {"text": "the quick brown fox: jumps - over…", "seed": 5, "max_new_tokens": 20, "min_p": 1.0, "cfg_weight": 0.3,
     "exaggeration": 0.9, "repetition_penalty": 1.3},
    {"text": "Pack my box with five dozen jugs", "seed": 7, "max_new_tokens": 16, "temperature": 1.2, "top_p": 0.9,
     "min_p": 0.1, "cfg_weight": 0.8},
]
S3GEN_CASES = [{"tokens": [1, 2, 300, 4000, 6000, 17, 17, 5, 6560, 0], "seed": 9}]
CLONE = {"text": "Hello there, how are you today?", "seed": 4, "max_new_tokens": 20, "exaggeration": 0.7}


def clip(seconds: float, voice: int = 0, rate: int = RATE) -> np.ndarray:
    """A voiced-sounding clip: a wavering pitch with harmonics, a syllable-rate envelope, a little noise,
    quiet margins (the voice encoder trims silence); `voice` moves the pitch."""
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(110 + 50 * voice + 20 * np.sin(2 * np.pi * 0.7 * t)) / rate
    wave = sum(0.3 / k * np.sin(k * phase) for k in range(1, 12)) * (0.6 + 0.4 * np.sin(2 * np.pi * 2.3 * t))
    wave *= (t > 0.4) & (t < seconds - 0.4)
    return (wave + 0.01 * np.random.default_rng(voice).standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chatterbox_clip") / "voice.wav"
    path.write_bytes(audio.encode(clip(10.5), RATE, "wav"))
    return path


@pytest.fixture(scope="module")
def cloner(folder):
    return VoiceCloner(folder)


@pytest.fixture(scope="module")
def folder() -> Path:
    from triton_omni.converters.tiny import build

    return build(TINY, ["chatterbox"])["chatterbox"]


@pytest.fixture(scope="module")
def t3(folder):
    return T3.load(folder)


@pytest.fixture(scope="module")
def s3gen(folder):
    return S3Gen.load(folder)


@pytest.fixture(scope="module")
def tokenizer(folder):
    return TextTokenizer(folder / "tokenizer.json")


@pytest.fixture(scope="module")
def voice(folder):
    return load_voice(folder)


@pytest.fixture(scope="module")
def ref(folder, clip_file, tmp_path_factory) -> dict[str, np.ndarray]:
    if not REF_PYTHON.exists():
        pytest.skip(f"reference environment not found ({REF_PYTHON}): run `bash scripts/setup_reference_envs.sh "
                    "chatterbox` to compare against the official chatterbox-tts package")
    tmp = tmp_path_factory.mktemp("chatterbox_ref")
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"cases": CASES, "s3gen": S3GEN_CASES, "clone": [{**CLONE, "wav": str(clip_file)}]},
                               ensure_ascii=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["HF_HUB_OFFLINE"] = "1"                         # local folders only: nothing may be downloaded
    run = subprocess.run([str(REF_PYTHON), str(ROOT / "tests" / "ref" / "chatterbox_ref.py"), str(spec), str(folder),
                          str(tmp / "ref.npz")], capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp))
    if run.returncode != 0:
        raise RuntimeError(f"reference run failed ({run.returncode}):\n{run.stderr[-4000:]}")
    return dict(np.load(tmp / "ref.npz"))


def sampling_for(case: dict) -> Sampling:
    """generate()'s keyword arguments as our Sampling; min_p = 1 (only the best token survives) is greedy."""
    keys = {k: v for k, v in case.items() if k in Sampling.__dataclass_fields__}
    if keys.get("min_p") == 1.0:
        keys.update(min_p=0.05, temperature=0.0)
    return Sampling(**keys)


def job_for(tokenizer, case: dict) -> T3Job:
    return T3Job(tokenizer.ids(case["text"]), sampling_for(case), case["seed"], case["max_new_tokens"])


def ref_tokens(ref, i: int) -> list[int]:
    return [t for t in ref[f"{i}.tokens"].tolist() if t < 6561]


# --- parity with the package --------------------------------------------------------------------
@pytest.mark.parity
def test_the_package_loads_every_weight_of_the_folder(ref):
    """T3 and the voice encoder load strictly; S3Gen misses only the S3 tokenizer's mel filters and window
    (computed by the package, not stored)."""
    assert json.loads(str(ref["load_problems"])) == {"missing": [], "unexpected": []}


@pytest.mark.parity
def test_text_ids_equal_the_package(tokenizer, ref):
    for i, case in enumerate(CASES):
        ids = tokenizer.ids(case["text"])
        assert ids[0] == 255 and ids[-1] == 0 and ids[1:-1] == ref[f"{i}.text_ids"].tolist(), i


@pytest.mark.parity
def test_t3_logits_equal_the_package(t3, tokenizer, voice, ref):
    """Every decode step's cond and uncond logits (ours teacher-forced in one pass, the package's from
    its KV-cached loop)."""
    for i, case in enumerate(CASES):
        raw = ref[f"{i}.tokens"].tolist()
        want = ref[f"{i}.logits"][:len(raw)]                                   # [steps, 2, V]
        with torch.inference_mode():
            ours = t3.logits(voice[0], tokenizer.ids(case["text"]), raw[:-1],
                             sampling_for(case).exaggeration).transpose(0, 1).numpy()
        assert ours.shape == want.shape and np.abs(want).max() > 5
        assert np.abs(ours - want).max() <= 2e-4, (i, np.abs(ours - want).max())


@pytest.mark.parity
def test_t3_tokens_equal_the_package(t3, tokenizer, voice, ref):
    """Same seed, same tokens: default sampling, greedy, top-p / min-p; all three in one batch."""
    jobs = [job_for(tokenizer, c) for c in CASES]
    together = generate_tokens(t3, voice[0], jobs)
    for i, (tokens, reason) in enumerate(together):
        assert len(set(tokens)) > 5 and reason == "length"
        assert tokens == ref_tokens(ref, i), i


@pytest.mark.parity
def test_s3gen_mel_and_waveform_equal_the_package(s3gen, voice, ref):
    """T3's tokens of the sampled case (the other two: test_pipeline_equals_generate) and given tokens."""
    cases = [(torch.tensor(ref_tokens(ref, 2)), CASES[2]["seed"], "2.")]
    cases += [(torch.tensor(c["tokens"]), c["seed"], f"s3gen.{k}.") for k, c in enumerate(S3GEN_CASES)]
    for tokens, seed, key in cases:
        gen = torch.Generator().manual_seed(seed)
        mel = s3gen.mel(tokens, voice[1], gen)[0].numpy()
        assert mel.shape == ref[key + "mel"].shape == (80, 2 * len(tokens))
        assert np.abs(mel - ref[key + "mel"]).max() <= 1e-4, key
        wave = s3gen.waveform(torch.from_numpy(mel)[None], gen)[0].numpy()
        want = ref[key + "wave"]
        assert wave.shape == want.shape == (960 * len(tokens),) and np.abs(want).max() > 0.05
        assert np.abs(wave - want).max() <= 1e-4, (key, np.abs(wave - want).max())


@pytest.mark.parity
def test_pipeline_equals_generate(steps, ref):
    """The served steps in process (default voice, seeded and greedy) against generate()'s waveform."""
    for i in (0, 1):
        case = CASES[i]
        s = sampling_for(case)
        sampling = {"seed": case["seed"], "max_tokens": case["max_new_tokens"],
                    **{k: getattr(s, k) for k in ("temperature", "top_p", "min_p", "repetition_penalty",
                                                  "cfg_weight", "exaggeration")}}
        wave = synthesize(steps, text=case["text"], sampling_parameters=sampling)
        assert wave.shape == ref[f"{i}.wave"].shape
        assert np.abs(wave - ref[f"{i}.wave"]).max() <= 1e-4, i


# --- voice cloning against prepare_conditionals ---------------------------------------------------
@pytest.fixture(scope="module")
def clone_wave(clip_file) -> np.ndarray:
    """The clip as pre hears it (decoded at 24 kHz)."""
    return audio.decode(clip_file.read_bytes(), RATE)[0]


@pytest.fixture(scope="module")
def cloned(cloner, clone_wave, ref):
    """Our conditioning for the clip, T3's from librosa's 16 kHz clip (the resampling: its own test)."""
    return cloner.clone(clone_wave, ref["clone.0.wav16"])


@pytest.mark.parity
def test_clone_s3gen_reference_equals_the_package(cloned, clone_wave, ref):
    """embed_ref of the first 10 s: torchaudio's resampling to 16 kHz, S3 tokens, mel, CAMPPlus x-vector."""
    k = "clone.0."
    assert np.array_equal(clone_wave, ref[k + "wav24"])               # PyAV's decode == librosa.load at 24 kHz
    wave16 = resample(torch.from_numpy(clone_wave), RATE, 16000).numpy()
    assert wave16.shape == ref[k + "sinc.wav16"].shape
    assert np.abs(wave16 - ref[k + "sinc.wav16"]).max() <= 1e-6
    got = cloned[1]
    assert got["prompt_token"].shape == (1, 250) and len(set(ref[k + "prompt_token"].tolist())) > 20
    assert np.array_equal(got["prompt_token"][0].numpy(), ref[k + "prompt_token"])
    assert np.abs(got["prompt_feat"][0].numpy() - ref[k + "prompt_feat"]).max() <= 1e-5        # measured 4.8e-7
    assert np.abs(got["embedding"][0].numpy() - ref[k + "embedding"]).max() <= 1e-5            # measured 0


@pytest.mark.parity
def test_clone_t3_conditioning_equals_the_package_on_the_same_16k_clip(cloner, ref):
    """The prompt tokens (first 6 s, at most 150) and the voice encoder's embedding, both from torchaudio's
    16 kHz clip (the same input on both sides)."""
    k = "clone.0."
    voice = cloner.t3_voice(torch.from_numpy(ref[k + "sinc.wav16"]))
    assert voice.prompt_tokens.shape == (1, 150)
    assert np.array_equal(voice.prompt_tokens[0].numpy(), ref[k + "sinc.prompt_tokens"])
    assert np.abs(voice.speaker[0].numpy() - ref[k + "sinc.speaker_emb"]).max() <= 1e-6       # measured 3e-8


@pytest.mark.parity
def test_clone_resampling_for_t3_is_close_to_soxr(cloner, cloned, clone_wave, ref):
    """The one part that is not exact: the package resamples T3's clip with librosa's soxr; FFmpeg's
    resampler stands in. Measured on this clip: 16 kHz samples max 0.0031 / rms 0.00077 apart (torchaudio's
    sinc: 0.0058 / 0.0014), the speaker embedding 3e-7, 80 % of the 150 prompt tokens equal (the tiny
    random tokenizer is far more sensitive than a trained one)."""
    k = "clone.0."
    ours, theirs = ffmpeg_resample(clone_wave, RATE, 16000), ref[k + "wav16"]
    assert ours.shape == theirs.shape
    assert np.sqrt(np.mean((ours - theirs) ** 2)) <= 1e-3 and np.abs(ours - theirs).max() <= 5e-3
    voice = cloner.t3_voice(torch.from_numpy(ours))                  # what clone() does without wave16
    assert np.abs(voice.speaker[0].numpy() - ref[k + "speaker_emb"]).max() <= 1e-5
    assert (voice.prompt_tokens[0].numpy() == ref[k + "prompt_tokens"]).mean() >= 0.6
    # given librosa's 16 kHz clip, T3's conditioning is the package's
    voice = cloned[0]
    assert np.array_equal(voice.prompt_tokens[0].numpy(), ref[k + "prompt_tokens"])
    assert np.abs(voice.speaker[0].numpy() - ref[k + "speaker_emb"]).max() <= 1e-6


@pytest.mark.parity
def test_cloned_generate_equals_the_package(t3, s3gen, tokenizer, cloned, ref):
    """generate(text, audio_prompt_path=clip) seeded: T3's tokens and the waveform, ours given librosa's
    16 kHz clip (the resampling difference alone: test_clone_resampling_for_t3_is_close_to_soxr)."""
    k = "clone.0."
    voice, s3ref = cloned
    job = job_for(tokenizer, CLONE)
    job.voice = voice
    (tokens, reason), = generate_tokens(t3, None, [job])
    assert reason == "length" and len(set(tokens)) > 5
    assert tokens == [t for t in ref[k + "tokens"].tolist() if t < 6561]
    wave = s3gen.synthesize(torch.tensor(tokens), s3ref, CLONE["seed"]).numpy()
    assert wave.shape == ref[k + "wave"].shape and np.abs(wave).max() > 0.05
    assert np.abs(wave - ref[k + "wave"]).max() <= 1e-4, np.abs(wave - ref[k + "wave"]).max()


# --- self-consistency (no reference needed) -------------------------------------------------------
def test_text_normalisation():
    """The package's punc_norm, quirks included (spaces collapse before "…" becomes ", ")."""
    assert normalize_text("hello   there… how are you") == "Hello there,  how are you."
    assert normalize_text("wait:what—“this”") == 'Wait,what-"this".'
    assert normalize_text("Fine?  ") == "Fine?"


def test_a_request_gets_the_same_tokens_alone_or_batched(t3, tokenizer, voice):
    jobs = [job_for(tokenizer, c) for c in CASES] + [T3Job(tokenizer.ids("Hi."), Sampling(), 1, 12)]
    alone = [generate_tokens(t3, voice[0], [j])[0] for j in jobs]
    together = generate_tokens(t3, voice[0], jobs[::-1])[::-1]
    assert len({len(j.text_ids) for j in jobs}) == len(jobs)
    assert together == alone
    other = generate_tokens(t3, voice[0], [T3Job(jobs[0].text_ids, jobs[0].sampling, 99, 24)])[0]
    assert other[0] != alone[0][0]


@pytest.fixture(scope="module")
def steps(folder):
    def ctx(name, params):
        return StepContext(name, params, "cpu", folder.parent)

    return (ChatterboxPre(ctx("pre", ChatterboxPreParams(checkpoint=str(folder), max_text_chars=600, max_tokens=30))),
            ChatterboxT3(ctx("t3", ChatterboxT3Params(checkpoint=str(folder)))),
            ChatterboxS3Gen(ctx("s3gen", ChatterboxS3GenParams(checkpoint=str(folder)))))


def request(**values) -> Request:
    """speech_request, with bytes (reference_audio) as they arrive."""
    raw = {k: v for k, v in values.items() if isinstance(v, bytes)}
    req = speech_request(**{k: v for k, v in values.items() if k not in raw})
    req.tensors.update({k: np.array([v], dtype=np.object_) for k, v in raw.items()})
    return req


def synthesize(steps, **values) -> np.ndarray:
    pre, t3_step, s3_step = steps
    out = pre.one(request(**values))
    tokens, = t3_step.execute([Request(out)])
    wave = s3_step.one(Request({**out, **tokens}))
    assert int(wave["sample_rate"][0]) == RATE and wave["finish_reason"][0] in (b"length", b"stop")
    return wave["waveform"]


def test_pre_builds_ids_and_sampling(steps, tokenizer):
    out = steps[0].one(speech_request(text="hello there", voice="default", response_format="wav",
                                      sampling_parameters={"seed": 4, "temperature": 0.5, "exaggeration": 1.0}))
    assert out["text_ids"].tolist() == tokenizer.ids("Hello there.")
    assert json.loads(out["sampling"][0]) == {"temperature": 0.5, "top_p": 1.0, "min_p": 0.05,
                                              "repetition_penalty": 1.2, "cfg_weight": 0.5, "exaggeration": 1.0,
                                              "max_tokens": 30}
    assert speech_fields(out["speech"][0]) == {"seed": 4, "response_format": "wav", "stream": False}


BAD = [
    ("empty text", {"text": " "}, "field 'text': is empty"),
    ("text too long", {"text": "pack my box " * 60}, "field 'text': is too long: 720 characters; at most 600"),
    ("unknown voice", {"voice": "alloy"}, "field 'voice': unknown voice 'alloy'; known: default"),
    ("reference not audio", {"reference_audio": b"RIFF0000WAVEnot really"},
     "field 'reference_audio': not a readable audio"),
    ("reference empty", {"reference_audio": b""}, "field 'reference_audio': is empty"),
    ("reference too short", {"reference_audio": audio.encode(clip(0.3), RATE, "wav")},
     "field 'reference_audio': is too short: 0.30 s; at least 0.5 s"),
    ("reference too long", {"reference_audio": audio.encode(clip(31.0), RATE, "wav")},
     "field 'reference_audio': is too long: 31.0 s; at most 30.0 s"),
    ("reference text alone", {"reference_text": "Hi."}, "field 'reference_text': describes reference_audio"),
    ("speed", {"speed": 1.5}, "field 'speed': this model speaks at 1.0"),
    ("unknown sampling key", {"sampling_parameters": {"top_k": 5}}, "field 'sampling_parameters.top_k'"),
    ("exaggeration", {"sampling_parameters": {"exaggeration": -1}},
     "field 'sampling_parameters.exaggeration': expected a number in [0.0, 5.0], got -1"),
    ("max tokens", {"sampling_parameters": {"max_tokens": 31}},
     "field 'sampling_parameters.max_tokens': expected an integer in [1, 30], got 31"),
]


@pytest.mark.parametrize("case,values,expect", BAD, ids=[b[0] for b in BAD])
def test_pre_refuses_bad_input(steps, case, values, expect):
    with pytest.raises(InvalidInput) as err:
        steps[0].one(request(**{"text": "Hi.", **values}))
    assert expect in str(err.value)


# --- live server ----------------------------------------------------------------------------------
MODEL = "chatterbox_tts"
DTYPES = {"stream": "BOOL", "speed": "FP32"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, folder):
    with running_server(tmp_path_factory.mktemp("chatterbox"), [MODEL],
                        [f"{MODEL}.pre.max_text_chars=600", f"{MODEL}.pre.max_tokens=30"]) as s:
        yield s


def speak(server, timeout=120, **values) -> list[tuple[bytes, int, str]]:
    return stream_speech(server, MODEL, {k: (v, DTYPES.get(k, "BYTES")) for k, v in values.items()}, timeout)


@pytest.mark.server
def test_served_wav_equals_in_process_synthesis(server, steps):
    values = {"text": "Hello there, how are you?", "sampling_parameters": {"seed": 11, "exaggeration": 0.7,
                                                                             "max_tokens": 16}}
    (wav, rate, reason), = speak(server, response_format="wav", **values)
    served, wav_rate = wav_pcm16(wav)
    assert (rate, wav_rate, reason) == (RATE, RATE, "length")
    local = synthesize(steps, **values)
    assert len(local) >= 8 * 960 and np.abs(local).max() > 0.05
    assert_int16_equal(served, audio.to_pcm16(local))


@pytest.mark.server
def test_served_cloned_wav_equals_in_process_synthesis(server, steps):
    """A 16 kHz FLAC reference (decoded and resampled to 24 kHz by the same decoder in both): the served
    WAV is the in-process pipeline's. The served request also carries a transcript (an uploaded voice
    may): Chatterbox does not use it."""
    upload = audio.encode(clip(2.0, voice=1, rate=16000), 16000, "flac")
    values = {"text": "Hello there, how are you?", "sampling_parameters": {"seed": 11, "max_tokens": 16}}
    (wav, rate, reason), = speak(server, response_format="wav", reference_audio=upload,
                                 reference_text="What the clip says.", **values)
    local = synthesize(steps, reference_audio=upload, **values)
    assert (rate, reason) == (RATE, "length") and np.abs(local).max() > 0.05
    assert_int16_equal(wav_pcm16(wav)[0], audio.to_pcm16(local))


@pytest.mark.server
def test_streamed_audio_is_one_chunk_equal_to_the_pcm_file(server):
    values = {"text": "The quick brown fox jumps over the lazy dog.", "sampling_parameters": {"seed": 3, "max_tokens": 12}}
    chunks = speak(server, stream=True, **values)
    (pcm, rate, _), = speak(server, response_format="pcm", **values)
    assert [(r, s) for _, s, r in chunks] == [("length", RATE)] and rate == RATE
    # at most 12 tokens (max_tokens), control tokens dropped: 960 samples of 16 bits each
    assert chunks[0][0] == pcm and len(pcm) % 1920 == 0 and 1920 * 6 <= len(pcm) <= 1920 * 12


SERVED_BAD = [BAD[i] for i in (0, 2, 3, 4, 5, 6, 10)]   # the rest: test_pre_refuses_bad_input (same step)


@pytest.mark.server
@pytest.mark.parametrize("case,values,expect", SERVED_BAD, ids=[b[0] for b in SERVED_BAD])
def test_bad_input_fails_that_request_only(server, case, values, expect):
    error, chunks = fails_beside(lambda: speak(server, **{"text": "Hi.", **values}),
                                 lambda: speak(server, text="Hi there.", stream=True,
                                               sampling_parameters={"seed": 1, "max_tokens": 8}))
    assert expect in error, error
    total = sum(len(a) for a, _, _ in chunks)
    assert chunks[-1][2] == "length" and total % 1920 == 0 and 0 < total <= 1920 * 8
