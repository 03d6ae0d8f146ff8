"""Kokoro-82M: our model against the release code (`kokoro` package's KModel) on the same tiny random
weights, the offline text front end, the steps in-process, and the served `kokoro_tts` ensemble on
a live tritonserver (files, streamed PCM chunks, bad input next to a good request).

The weights are random (the audio is noise-like); what is checked is that the numbers are the
release's and that the serving path carries them unchanged.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from triton_omni.media import audio
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request, ResponseSink, StepContext
from triton_omni.tts.chunking import SpeechChunks, SpeechChunksParams
from triton_omni.tts.kokoro.model import MAX_PHONEMES, WEIGHTS_FILE, Kokoro, load_voice, voice_style
from triton_omni.tts.kokoro.steps import KokoroPre, KokoroPreParams, KokoroSynth, KokoroSynthParams
from triton_omni.tts.kokoro.text import LANGUAGES, Phonemizer, check_phonemes, segments, to_kokoro
from triton_omni.tts.request import Speech
from tests.conftest import TINY, assert_int16_equal, rounds_until_batched, running_server, speech_fields, wav_pcm16
from tests.test_tts_orpheus import speech_request
from tests.test_tts_server import fails_beside, stream_speech

HELLO = "həlˈO, wˈɜɹld!"
FOX = "ðə kwˈɪk bɹˈWn fˈɑks."
RATE = 24000
FRAME = 600                      # samples per predicted frame (upsample 10 * 6, hop 5, x2 in the decoder)
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")


@pytest.fixture(scope="module")
def folder():
    from triton_omni.converters.tiny import build

    return build(TINY, ["kokoro"])["kokoro"]       # only this one (the GPU machine lacks the others' packages)


@pytest.fixture(scope="module")
def model(folder):
    return Kokoro.load(folder)


def style_for(folder, voice: str, phonemes: str) -> torch.Tensor:
    return voice_style(load_voice(folder / "voices" / f"{voice}.pt"), len(phonemes))[None]


def ids_of(model, phonemes: str) -> list[int]:
    return [0, *(model.vocab[c] for c in phonemes), 0]


# --- release layout and parity ----------------------------------------------------------------------
def test_tiny_checkpoint_has_the_release_layout(folder):
    release = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    assert sorted(release) == sorted(["bert", "bert_encoder", "predictor", "text_encoder", "decoder"])
    assert all(k.startswith("module.") for part in release.values() for k in part)
    decoder = release["decoder"]
    assert "module.generator.conv_post.weight_g" in decoder and "module.generator.conv_post.weight_v" in decoder
    assert decoder["module.encode.conv1.weight_v"].shape == (1024, 514, 3)     # the hard-coded widths
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert (config["hidden_dim"], config["style_dim"], config["n_token"], len(config["vocab"])) == (512, 128, 178, 114)
    pack = torch.load(folder / "voices" / "af_heart.pt", weights_only=True)
    assert pack.shape == (510, 1, 256)


def reference_kmodel(folder):
    """The release's KModel, imported without the package's __init__ (which pulls in misaki's English
    G2P and spaCy): model.py needs only torch, transformers, loguru and huggingface_hub."""
    spec = importlib.util.find_spec("kokoro")
    if spec is None or importlib.util.find_spec("loguru") is None:
        pytest.skip("the reference `kokoro` package (pip install --no-deps kokoro==0.9.4; loguru) is not installed")
    if "kokoro" not in sys.modules:
        package = types.ModuleType("kokoro")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["kokoro"] = package
    from kokoro.model import KModel
    from loguru import logger

    logger.disable("kokoro")                       # as the package's __init__ does
    return KModel(repo_id="hexgrad/Kokoro-82M", config=str(folder / "config.json"),
                  model=str(folder / WEIGHTS_FILE)).eval()


@pytest.fixture(scope="module")
def reference(folder):
    return reference_kmodel(folder)


@pytest.mark.parity
def test_reference_loaded_every_weight_of_the_file(folder, reference):
    """KModel falls back to strict=False for `module.` keys: make sure nothing was skipped, so the
    comparison below really runs the file's weights. Only InstanceNorm's affine (1, 0) is missing:
    the release code has it, the release file does not."""
    release = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    for part, state in release.items():
        theirs = set(getattr(reference, part).state_dict())
        ours = {k.removeprefix("module.") for k in state} - {"embeddings.position_ids"}
        assert ours <= theirs, (part, sorted(ours - theirs)[:5])
        assert all(k.endswith((".norm.weight", ".norm.bias")) for k in theirs - ours), (part, sorted(theirs - ours)[:5])


@pytest.mark.parity
@pytest.mark.parametrize("phonemes,voice,speed,seed", [
    (HELLO, "af_heart", 1.0, None),
    (FOX, "bf_emma", 1.3, None),
    (HELLO, "am_adam", 0.8, 7),
])
def test_audio_equals_the_reference(folder, model, reference, monkeypatch, phonemes, voice, speed, seed):
    """Same phonemes, voice, speed: the same durations and the same samples (|diff| <= 1e-5; in
    practice bit for bit). Noise: none (the reference's draws patched to zeros), or the seed as a
    torch seed for the reference and as our per-request generator."""
    style = style_for(folder, voice, phonemes)
    noise = torch.Generator().manual_seed(seed) if seed is not None else None
    (ours, frames), = model.synthesize([ids_of(model, phonemes)], style, torch.tensor([speed]), [noise])
    if seed is None:
        import kokoro.istftnet as istftnet

        monkeypatch.setattr(istftnet.torch, "rand", lambda *a, **k: torch.zeros(*a, **k))
        monkeypatch.setattr(istftnet.torch, "randn_like", lambda x, **k: torch.zeros_like(x))
    else:
        torch.manual_seed(seed)
    theirs = reference(phonemes, style, speed, return_output=True)
    monkeypatch.undo()
    assert frames.tolist() == theirs.pred_dur.tolist()
    assert ours.shape == theirs.audio.shape == (FRAME * int(frames.sum()),)
    assert float((ours - theirs.audio).abs().max()) <= 1e-5
    assert 0.05 < float(ours.abs().max()) < 1.0       # audible, not clipping


def test_speed_divides_durations(folder, model):
    style = style_for(folder, "af_heart", FOX)
    waves = model.synthesize([ids_of(model, FOX)] * 2, style.repeat(2, 1), torch.tensor([1.0, 2.0]), [None, None])
    (slow, f1), (fast, f2) = waves
    assert f1.sum() > f2.sum() and len(fast) == FRAME * int(f2.sum()) < len(slow)
    # round(sigmoid sum / 2) from the same sums: each halved duration is within one frame of half
    assert ((f2 - f1 / 2).abs() <= 1).all()


def test_batched_rows_keep_their_durations(folder, model):
    """Rows batched (padded text side) get the same durations and F0 as alone. Their samples differ
    in the last bits' consequences: the vocoder reads its source's STFT phase, which jumps where a
    bin is near silent, so a rounding-level change of F0 moves samples (see python_backends/tts/kokoro/model.py)."""
    pss = [HELLO, "hˈI"]
    styles = torch.cat([style_for(folder, "af_heart", p) for p in pss])
    alone = [model.synthesize([ids_of(model, p)], styles[i:i + 1], torch.tensor([1.0]), [None])[0]
             for i, p in enumerate(pss)]
    together = model.synthesize([ids_of(model, p) for p in pss], styles, torch.ones(2), [None] * 2)
    again = model.synthesize([ids_of(model, p) for p in pss], styles, torch.ones(2), [None] * 2)
    for (a, fa), (b, fb), (c, _) in zip(alone, together, again):
        assert fa.tolist() == fb.tolist() and a.shape == b.shape
        assert torch.equal(b, c)                      # the same batch: the same samples


def test_one_row_syncs_the_host_once(folder, model):
    """On a GPU the model is launch-bound and every host sync stalls it: a row alone copies its
    inputs over and reads its frame count, nothing more (no masks, no packed LSTMs). Counted on the
    CPU as perf_analyzer_configs/probes/op_count.py does (where tensors would live is tracked by hand)."""
    from perf_analyzer_configs.probes.op_count import Residency

    style, residency = style_for(folder, "af_heart", FOX), Residency(model)
    with residency:
        model.synthesize([ids_of(model, FOX)], style, torch.ones(1), [torch.Generator(model.device).manual_seed(1)])
    assert sum(residency.syncs.values()) == 4, residency.syncs        # ids, style, speed over; frames back


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_gpu_in_float32_and_bfloat16(folder, model):
    """CUDA float32: the CPU's durations and lengths, samples as loud (not equal: rounding moves
    them, see above). bfloat16 (LSTMs, source and iSTFT stay float32): durations within a frame,
    finite audio of about the same loudness."""
    import time

    pss = [HELLO, FOX, (FOX + " ") * 20]
    rows, styles = [ids_of(model, p) for p in pss], torch.cat([style_for(folder, "af_heart", p) for p in pss])
    cpu = model.synthesize(rows, styles, torch.ones(3), [None] * 3)
    for dtype in (torch.float32, torch.bfloat16):
        gpu = Kokoro.load(folder, "cuda", dtype)
        out = gpu.synthesize(rows, styles, torch.ones(3), [None] * 3)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = gpu.synthesize(rows, styles, torch.ones(3), [torch.Generator("cuda").manual_seed(1)] * 3)
        torch.cuda.synchronize()
        seconds = sum(len(w) for w, _ in out) / RATE
        print(f"{dtype}: {seconds:.1f} s of audio in {time.perf_counter() - start:.3f} s")
        for (c, fc), (g, fg) in zip(cpu, out):
            fg = fg.cpu()
            if dtype == torch.float32:
                assert fg.tolist() == fc.tolist() and g.shape == c.shape
            else:
                assert (fg - fc).abs().max() <= 1 and (fg == fc).float().mean() > 0.8
            g = g.cpu()
            assert torch.isfinite(g).all() and float(g.abs().max()) < 1.0
            assert abs(float(g.std()) / float(c.std()) - 1) < 0.25


# --- text front end -------------------------------------------------------------------------------
def test_espeak_mapping_to_kokoro_symbols():
    # espeak-ng 1.51's IPA (tie ^) for "Hello there, thirty bottles" in en-us and en-gb
    assert to_kokoro("həlˈo^ʊ ðˈɛ^ɹ", "en-us") == "həlˈO ðˈɛɹ"
    assert to_kokoro("θˈɜːɾi bˈɑːɾə^lz", "en-us") == "θˈɜɹTi bˈɑTᵊlz"
    assert to_kokoro("həlˈə^ʊ ðˈe^ə", "en-gb") == "həlˈQ ðˈɛː"
    assert to_kokoro("d^ʒˈʌmps t^ʃˈiːz", "en-gb") == "ʤˈʌmps ʧˈiːz"
    assert to_kokoro("(^e^n)ðˈe^ə(^f^r) bɔ̃ʒˈuʁ", "fr-fr") == "ðˈeə bɔ̃ʒˈuʁ"     # no language switches


@needs_espeak
def test_text_to_phonemes_keeps_punctuation(folder):
    vocab = json.loads((folder / "config.json").read_text(encoding="utf-8"))["vocab"]
    g2p = Phonemizer(vocab)
    assert g2p("Hello, world!", "af_heart") == "həlˈO, wˈɜɹld!"
    assert g2p("Hello there (yes).", "bf_emma") == "həlˈQ ðˈɛː (jˈɛs)."
    assert g2p("Bonjour!", "ff_siwis") == "bɔ̃ʒˈuʁ!"
    with pytest.raises(InvalidInput, match="field 'text': voice 'jf_alpha' has no offline phonemizer.*pass `phonemes`"):
        g2p("konnichiwa", "jf_alpha")
    assert set(LANGUAGES) == set("abefhip")


def test_without_espeak_text_asks_for_phonemes(folder):
    g2p = Phonemizer({"a": 43}, binary="no-such-espeak-ng")
    with pytest.raises(InvalidInput, match="field 'text': .*espeak-ng is not installed.*pass `phonemes`"):
        g2p("Hello", "af_heart")


def test_segments_cut_at_sentence_then_clause_then_space():
    assert segments("ab cd. ef gh, ij kl mn", 8) == ["ab cd.", "ef gh,", "ij kl mn"]
    assert segments("ab, cd ef. gh", 10) == ["ab, cd ef.", "gh"]
    assert segments("abcdefghijkl", 5) == ["abcde", "fghij", "kl"]
    long = ("ðə kwˈɪk bɹˈWn fˈɑks. " * 40).strip()
    pieces = segments(long)
    assert all(len(p) <= MAX_PHONEMES and p.endswith(".") for p in pieces) and " ".join(pieces) == long
    assert check_phonemes(" a  b ", {"a": 1, "b": 2, " ": 3}) == "a b"
    with pytest.raises(InvalidInput, match="field 'phonemes': symbols not in the model's vocabulary: '#' 'Z'"):
        check_phonemes("a#Z", {"a": 1})


# --- steps in-process -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pre(folder):
    return KokoroPre(StepContext("kokoro_pre", KokoroPreParams(checkpoint=str(folder), max_text_chars=600),
                                 "cpu", folder.parent))


@pytest.fixture(scope="module")
def synth(folder):
    return KokoroSynth(StepContext("kokoro_synth", KokoroSynthParams(checkpoint=str(folder)), "cpu", folder.parent))


def synthesize(pre, synth, **values) -> np.ndarray:
    """pre then synth in-process, as the ensemble wires them (speed goes to both)."""
    out = pre.one(speech_request(**values))
    if "speed" in values:
        out["speed"] = np.asarray([values["speed"]], np.float32)
    result, = synth.execute([Request(out)])
    assert int(result["sample_rate"][0]) == RATE
    return result["waveform"]


def test_pre_turns_phonemes_into_segments_and_styles(pre, folder):
    out = pre.one(speech_request(phonemes=FOX, voice="bf_emma", response_format="wav",
                                 sampling_parameters={"seed": 4}))
    vocab = pre.vocab
    assert out["phoneme_ids"].tolist() == [0, *(vocab[c] for c in FOX), 0]
    assert out["segments"].tolist() == [len(FOX) + 2]
    assert np.array_equal(out["style"], style_for(folder, "bf_emma", FOX).numpy())
    assert speech_fields(out["speech"][0]) == {"seed": 4, "response_format": "wav", "stream": False}
    # over 510 phonemes: segments, each with the style for its own length
    long = pre.one(speech_request(phonemes=(FOX + " ") * 25))
    lengths = long["segments"].tolist()
    assert len(lengths) == 2 and sum(lengths) == len(long["phoneme_ids"]) and max(lengths) <= MAX_PHONEMES + 2
    assert np.array_equal(long["style"][1], style_for(folder, "af_heart", "x" * (lengths[1] - 2))[0].numpy())


@needs_espeak
def test_pre_phonemizes_text(pre):
    out = pre.one(speech_request(text="Hello, world!", stream=True))
    assert out["phoneme_ids"].tolist() == [0, *(pre.vocab[c] for c in HELLO), 0]
    speech = json.loads(out["speech"][0])
    assert speech["stream"] and speech["response_format"] == "mp3" and isinstance(speech["seed"], int)


@pytest.mark.parametrize("values,field", [
    ({}, "field 'text': is empty"),
    ({"text": "   "}, "field 'text': is empty"),
    ({"text": "x" * 700}, "field 'text': is too long: 700 characters; at most 600"),
    ({"phonemes": "a" * 700}, "field 'phonemes': is too long: 700 characters"),
    ({"phonemes": "hɛlo#"}, "field 'phonemes': symbols not in the model's vocabulary: '#'"),
    ({"text": "hi", "voice": "alloy"}, "field 'voice': unknown voice 'alloy'; known: af_heart, am_adam"),
    ({"text": "hi", "speed": 9.0}, "field 'speed': must be in [0.25, 4.0]"),
    ({"text": "hi", "response_format": "aac"}, "field 'response_format'"),
    ({"text": "hi", "reference_audio": "RIFF...."}, "field 'reference_audio': this model does not clone voices"),
    ({"text": "hi", "sampling_parameters": {"temperature": 0.7}}, "field 'sampling_parameters.temperature'"),
    ({"text": "hi", "sampling_parameters": {"seed": -1}}, "field 'sampling_parameters.seed'"),
])
def test_pre_refuses_bad_input(pre, values, field):
    with pytest.raises(InvalidInput) as err:
        pre.one(speech_request(**values))
    assert field in str(err.value)


def test_synth_follows_seed_and_speed(pre, synth):
    a = synthesize(pre, synth, phonemes=HELLO, sampling_parameters={"seed": 1})
    b = synthesize(pre, synth, phonemes=HELLO, sampling_parameters={"seed": 1})
    c = synthesize(pre, synth, phonemes=HELLO, sampling_parameters={"seed": 2})
    fast = synthesize(pre, synth, phonemes=HELLO, sampling_parameters={"seed": 1}, speed=2.0)
    assert np.array_equal(a, b) and a.shape == c.shape and not np.array_equal(a, c)
    assert len(a) % FRAME == 0 and len(fast) < len(a)


def two_segments(first: dict, second: dict) -> dict:
    """One request of two segments, as pre sends text over 510 phonemes (cheaper to synthesize)."""
    return dict(first, phoneme_ids=np.concatenate([first["phoneme_ids"], second["phoneme_ids"]]),
                segments=np.concatenate([first["segments"], second["segments"]]),
                style=np.concatenate([first["style"], second["style"]]))


def test_synth_batches_requests_and_segments(pre, synth):
    """Three requests in one execute (one of two segments): each gets exactly its audio alone, a
    segmented request as long as its segments; a bad request fails alone."""
    hello, hi = (pre.one(speech_request(phonemes=p, sampling_parameters={"seed": 1})) for p in (HELLO, "hˈI"))
    reqs = [hello, two_segments(hello, hi), hi]
    alone = [synth.execute([Request(r)])[0]["waveform"] for r in reqs]
    assert len(alone[1]) == len(alone[0]) + len(alone[2])
    bad = dict(reqs[0], style=np.zeros((3, 256), np.float32))        # 3 styles for 1 segment
    together = synth.execute([Request(r) for r in reqs[:2]] + [Request(bad), Request(reqs[2])])
    assert isinstance(together[2], InvalidInput) and str(together[2]) == "field 'style': 3 styles for 1 segments"
    assert all(np.array_equal(r["waveform"], a) for r, a in zip([together[0], together[1], together[3]], alone))


class Collect(ResponseSink):
    def __init__(self):
        self.responses = []

    def send(self, outputs, final=False):
        self.responses.append((outputs, final))


def test_chunks_cut_a_small_first_chunk_then_seconds(pre, synth):
    chunks = SpeechChunks(StepContext("speech_chunks", SpeechChunksParams(first_chunk_ms=200, chunk_ms=1000),
                                      "cpu", pre.ctx.base_dir))
    assert chunks.cuts(60000, RATE) == [4800, 28800, 52800, 60000] and chunks.cuts(3000, RATE) == [3000]
    wave = np.arange(30000, dtype=np.float32)
    for stream, sizes in ((True, [4800, 24000, 1200]), (False, [30000])):
        sink = Collect()
        chunks.submit(Request({"waveform": wave, "sample_rate": np.asarray([RATE], np.int32),
                               "speech": Speech(1, "pcm", stream).tensor()}), sink)
        assert [len(o["waveform"]) for o, _ in sink.responses] == sizes
        assert [f for _, f in sink.responses] == [False] * (len(sizes) - 1) + [True]
        assert [o["finish_reason"][0] for o, _ in sink.responses] == [b""] * (len(sizes) - 1) + [b"stop"]
        assert np.array_equal(np.concatenate([o["waveform"] for o, _ in sink.responses]), wave)


# --- live server ----------------------------------------------------------------------------------
MODEL = "kokoro_tts"
DTYPES = {"stream": "BOOL", "speed": "FP32"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, folder):
    with running_server(tmp_path_factory.mktemp("kokoro"), [MODEL], [f"{MODEL}.pre.max_text_chars=600"]) as s:
        yield s


def speak(server, timeout=120, **values) -> list[tuple[bytes, int, str]]:
    """One request over a gRPC stream: [(audio, sample_rate, finish_reason)] per response."""
    return stream_speech(server, MODEL, {k: (v, DTYPES.get(k, "BYTES")) for k, v in values.items()}, timeout)


@pytest.mark.server
def test_served_wav_equals_in_process_synthesis(server, pre, synth):
    seed = {"seed": 11}
    (wav, rate, reason), = speak(server, phonemes=FOX, voice="am_adam", response_format="wav", sampling_parameters=seed)
    served, wav_rate = wav_pcm16(wav)
    assert (rate, wav_rate, reason) == (RATE, RATE, "stop")
    local = synthesize(pre, synth, phonemes=FOX, voice="am_adam", sampling_parameters=seed)
    assert_int16_equal(served, audio.to_pcm16(local))
    assert np.abs(local).max() > 0.05


@pytest.mark.server
def test_streamed_chunks_concatenate_to_the_file(server):
    values = {"phonemes": (FOX + " ") * 2, "sampling_parameters": {"seed": 3}}
    chunks = speak(server, stream=True, **values)
    (pcm, rate, _), = speak(server, response_format="pcm", **values)
    sizes = [len(a) // 2 for a, _, _ in chunks]
    assert sizes[0] == 4800 and all(s == 24000 for s in sizes[1:-1]) and 0 < sizes[-1] <= 24000 and len(sizes) >= 3
    assert [r for _, _, r in chunks] == [""] * (len(chunks) - 1) + ["stop"] and {s for _, s, _ in chunks} == {RATE}
    assert b"".join(a for a, _, _ in chunks) == pcm and rate == RATE


@needs_espeak
@pytest.mark.server
def test_served_text_goes_through_espeak(server):
    by_text = speak(server, text="Hello, world!", response_format="pcm", sampling_parameters={"seed": 5})
    by_phonemes = speak(server, phonemes=HELLO, response_format="pcm", sampling_parameters={"seed": 5})
    assert by_text == by_phonemes and len(by_text[0][0]) > 2 * RATE // 4


@pytest.mark.server
def test_concurrent_requests_share_synth_batches(server):
    """Requests at once share synth executions (fewer executions than requests) and each gets
    exactly the audio it gets alone."""

    phonemes = [HELLO, FOX, "hˈI", "ðə dˈɑɡ.", "wˈʌn, tˈu, θɹˈi.", "jˈɛs!"]

    def say(i: int) -> bytes:
        return speak(server, phonemes=phonemes[i], response_format="pcm", sampling_parameters={"seed": i})[0][0]

    alone = [say(i) for i in range(len(phonemes))]

    def together() -> list:
        with ThreadPoolExecutor(len(phonemes)) as pool:
            return list(pool.map(say, range(len(phonemes))))

    rounds = rounds_until_batched(server, f"{MODEL}_synth", together)
    assert all(len(a) > 0 for a in alone)
    for pcm, inferences, _ in rounds:
        assert pcm == alone and inferences == len(phonemes)
    assert rounds[-1][2] < rounds[-1][1], rounds[-1][1:]


BAD = [
    ("empty text", {"text": ""}, "field 'text': is empty"),
    ("unknown voice", {"voice": "alloy"}, "field 'voice': unknown voice 'alloy'"),
    ("text too long", {"text": "pack my box " * 60}, "field 'text': is too long: 720 characters; at most 600"),
    ("reference audio", {"reference_audio": "RIFF0000WAVE"}, "field 'reference_audio': this model does not clone"),
    ("speed", {"speed": 5.0}, "field 'speed': must be in [0.25, 4.0]"),
    ("unknown phoneme", {"phonemes": "hɛ#lo"}, "field 'phonemes': symbols not in the model's vocabulary"),
    ("sampling", {"sampling_parameters": {"top_p": 0.5}}, "field 'sampling_parameters.top_p'"),
]


@pytest.mark.server
@pytest.mark.parametrize("case,values,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_input_fails_that_request_only(server, case, values, expect):
    error, chunks = fails_beside(lambda: speak(server, **{"text": "Hi.", **values}),
                                 lambda: speak(server, phonemes="hˈI", stream=True, sampling_parameters={"seed": 1}))
    assert expect in error, error
    assert chunks[-1][2] == "stop" and sum(len(a) for a, _, _ in chunks) % (2 * FRAME) == 0


@pytest.mark.server
@needs_espeak
def test_perf_analyzer_measures_kokoro(server, tmp_path):
    """perf_analyzer (streaming, text through espeak-ng; a one-word text: this checkpoint has the
    release's decoder widths, seconds a sentence on a small CPU) gets numbers from the live server."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "perf_analyzer_configs.runner.run", "--url", server.grpc_url, "--models", MODEL,
                          "--concurrency", "1", "--measurement-requests", "2", "--max-trials", "3", "--stability", "999",
                          "--timeout", "180", "--input", "text=Hi.", "--out", str(tmp_path)], cwd=root, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads((tmp_path / "perf_analyzer.json").read_text())["rows"]
    assert [r["model"] for r in rows] == [MODEL] and rows[0]["throughput_per_s"] > 0
