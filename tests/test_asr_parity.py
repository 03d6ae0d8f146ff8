"""Omnilingual ASR CTC against transformers on the tiny random checkpoint, and the pieces around it:
the packed encoder (logits, CTC ids, text) equal to `OmniASRForCTC` one clip at a time; a packed batch
of different lengths equal to each clip alone; the feature extractor; Silero VAD against the package's
own model; segmentation, CTC collapsing and transcript assembly."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from triton_omni.asr import ctc, segment
from triton_omni.asr.features import normalize_clips
from triton_omni.asr.omniasr.model import OmniASRCTC, PackedClips
from triton_omni.asr.transcript import Detokenizer, assemble

pytestmark = pytest.mark.parity
LENGTHS = (16000, 7777, 32123, 400, 1001)


@pytest.fixture(scope="module")
def speech_wave() -> np.ndarray:
    from triton_omni.media.audio import decode
    from tests.asr_audio import espeak_wav

    return decode(espeak_wav(), 16000)[0]


@pytest.fixture(scope="module")
def folder(tiny_checkpoints):
    return tiny_checkpoints["omniasr_ctc"]


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import AutoProcessor, OmniASRForCTC

    return OmniASRForCTC.from_pretrained(str(folder)).eval(), AutoProcessor.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def ours(folder):
    return OmniASRCTC.load(folder)


def clips(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # speech-like: noise under a slow envelope, so frames differ from each other
    return [torch.randn(n, generator=g) * (0.05 + 0.3 * torch.sin(torch.arange(n) / 900.0).abs()) for n in LENGTHS]


def packed_logits(model, batch: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.inference_mode():
        packed = PackedClips.build(normalize_clips(batch), model.config.audio)
        return list(model(packed).split(packed.frames))


def test_feature_extractor_normalisation(reference):
    _, processor = reference
    for clip in clips():
        want = processor.feature_extractor(clip.numpy(), sampling_rate=16000)["input_values"][0, 0]
        torch.testing.assert_close(normalize_clips([clip])[0], want, rtol=1e-5, atol=1e-5)


def test_packed_encoder_equals_transformers_clip_by_clip(reference, ours):
    model, processor = reference
    batch = clips()
    mine = packed_logits(ours, batch)
    tokenizer = processor.tokenizer
    detok = Detokenizer(tokenizer)
    for clip, got in zip(batch, mine):
        inputs = processor.feature_extractor(clip.numpy(), sampling_rate=16000)
        with torch.inference_mode():
            want = model(**inputs).logits[0]
            want_ids = model.generate(**inputs)[0]
        assert got.shape == want.shape == (ours.config.audio.frames(clip.numel()), ours.config.vocab_size)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert torch.equal(got.argmax(-1), want_ids)                          # the CTC ids
        tokens = ctc.greedy(got.argmax(-1).numpy(), ours.config.blank_token_id)
        assert detok(tokens.ids) == processor.decode(want_ids, skip_special_tokens=True).strip()


def test_packed_batch_equals_each_clip_alone(ours):
    batch = clips(1)
    together = packed_logits(ours, batch)
    for clip, got in zip(batch, together):
        torch.testing.assert_close(got, packed_logits(ours, [clip])[0], rtol=1e-5, atol=1e-5)
    # the transformers batch (padded to the longest, masked) agrees as well
    assert sum(t.shape[0] for t in together) == sum(ours.config.audio.frames(c.numel()) for c in batch)


def test_padded_transformers_batch_matches_packed(reference, ours):
    model, processor = reference
    batch = clips(2)
    inputs = processor.feature_extractor([c.numpy() for c in batch], sampling_rate=16000)
    with torch.inference_mode():
        padded = model(**inputs).logits
    for i, got in enumerate(packed_logits(ours, batch)):
        torch.testing.assert_close(got, padded[i, :got.shape[0]], rtol=1e-4, atol=1e-4)


# -- Silero VAD ------------------------------------------------------------------------------------
def test_vad_equals_the_package_model(speech_wave):
    from triton_omni.asr.vad import PART_WINDOWS, SileroVAD, VADSettings, one_thread, speech_regions, weights_file

    threads = torch.get_num_threads()
    import silero_vad                     # its import sets torch to one thread

    torch.set_num_threads(threads)
    wave = torch.from_numpy(np.concatenate([np.zeros(8000, np.float32), speech_wave, np.zeros(20000, np.float32),
                                            speech_wave]))
    assert wave.numel() < PART_WINDOWS * 512       # one part: the package's sequence exactly
    jit = torch.jit.load(str(weights_file()))
    n = -(-wave.numel() // 512)
    x = torch.nn.functional.pad(wave, (0, n * 512 - wave.numel()))
    with torch.inference_mode(), one_thread():            # the package's way: one window a call
        want = torch.cat([jit(x[i * 512:(i + 1) * 512][None], 16000)[0] for i in range(n)])
        jit.reset_states()
        stamps = [(d["start"], d["end"]) for d in silero_vad.get_speech_timestamps(wave, jit)]
    got = SileroVAD.load().probabilities(wave)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert speech_regions(got, wave.numel(), VADSettings()) == stamps and len(stamps) >= 2


def test_vad_of_long_audio_runs_in_parts(speech_wave):
    """Past one part, the parts run side by side from a warm-up each: the same speech regions."""
    from triton_omni.asr.vad import PART_WINDOWS, SileroVAD, speech_regions

    gap = np.zeros(16000 * 3, np.float32)
    wave = np.concatenate([gap, speech_wave] * 30)
    assert wave.size > 2 * PART_WINDOWS * 512
    vad = SileroVAD.load()
    probs = vad.probabilities(torch.from_numpy(wave))
    regions = speech_regions(probs, wave.size)
    period = gap.size + speech_wave.size
    starts = [gap.size + i * period for i in range(30)]
    assert len(regions) >= 30 and all(any(abs(a - s) < 4000 for a, _ in regions) for s in starts)


# -- segmentation, CTC, transcript -------------------------------------------------------------------
def test_windows_cover_the_audio_once_within_the_limit():
    s = segment.SegmentSettings(max_segment_s=30, overlap_s=2)
    for n in (16000, 30 * 16000, 30 * 16000 + 1, 95 * 16000 + 123, 601 * 16000):
        pieces = segment.windows(0, n, s)
        assert all(p.length <= 30 * 16000 for p in pieces)
        assert pieces[0].keep_from == 0 and pieces[-1].keep_to == n == pieces[-1].end
        assert all(a.keep_to == b.keep_from and b.start < a.end for a, b in zip(pieces, pieces[1:]))
        assert all(p.start <= p.keep_from < p.keep_to <= p.end for p in pieces)


def test_vad_regions_pack_into_segments():
    s = segment.SegmentSettings(max_segment_s=10, overlap_s=1, max_gap_s=1.5)
    r = 16000
    regions = [(1 * r, 3 * r), (4 * r, 9 * r), (12 * r, 14 * r), (20 * r, 45 * r)]     # gaps of 1, 3, 6 s
    pieces = segment.pack_regions(regions, 50 * r, s)
    assert [(p.start // r, p.end // r) for p in pieces][:2] == [(1, 9), (12, 14)]
    assert all(p.length <= 10 * r for p in pieces) and pieces[-1].end == 45 * r
    assert pieces[0].keep_from == 0 and pieces[-1].keep_to == 50 * r
    assert all(a.keep_to == b.keep_from for a, b in zip(pieces, pieces[1:]))


def test_greedy_ctc_collapses_runs_and_drops_blanks():
    t = ctc.greedy(np.array([0, 5, 5, 0, 5, 7, 7, 7, 0, 0, 3]), blank=0)
    assert t.ids.tolist() == [5, 5, 7, 3] and t.first.tolist() == [1, 4, 5, 10] and t.last.tolist() == [2, 4, 7, 10]
    assert len(ctc.greedy(np.zeros(0, np.int64), 0)) == 0 and len(ctc.greedy(np.zeros(9, np.int64), 0)) == 0


def test_overlapping_windows_keep_each_token_once(folder):
    from triton_omni.text.tokenizer import load_tokenizer

    tok = load_tokenizer(folder)
    detok = Detokenizer(tok)
    ids = tok("the quick brown fox jumps over the lazy dog")["input_ids"]
    stride, frame = 320, 4                     # a token every 4 frames, one blank frame between
    frames = np.zeros(len(ids) * frame, np.int64)
    frames[::frame] = ids
    whole = segment.Segment(0, frames.size * stride, 0, frames.size * stride)
    cut = frames.size // 2 * stride
    a = segment.Segment(0, cut + 8 * stride, 0, cut)                  # overlapping by 16 frames
    b = segment.Segment(cut - 8 * stride, frames.size * stride - cut + 8 * stride, cut, frames.size * stride)
    lp = np.full(frames.size, -0.5, np.float32)
    one = assemble([whole], [ctc.greedy(frames, 0)], [lp], stride, detok, words=True)
    fa, fb = frames[:a.length // stride], frames[b.start // stride:]
    two = assemble([a, b], [ctc.greedy(fa, 0), ctc.greedy(fb, 0)], [lp[:fa.size], lp[:fb.size]], stride, detok, True)
    assert one.text == two.text == "the quick brown fox jumps over the lazy dog"
    assert [w["word"] for w in two.words] == one.text.split() and two.words == one.words
    assert [s["start"] for s in two.segments] == [0.0, two.segments[1]["start"]] and len(two.segments) == 2
    assert two.segments[0]["end"] <= two.segments[1]["start"] and two.segments[0]["avg_logprob"] == -0.5


def test_encoder_step_forwards_within_its_frame_budget(folder):
    """A request set larger than max_batch_frames runs in several forwards: the same outputs as in one."""
    from pathlib import Path

    from triton_omni.asr.omniasr.steps import OmniASRCTCEncoder, OmniASRCTCEncoderParams
    from triton_omni.runtime.step import Request, StepContext

    def step(budget):
        params = OmniASRCTCEncoderParams(checkpoint=str(folder), max_batch_frames=budget)
        return OmniASRCTCEncoder(StepContext("enc", params, "cpu", Path(".")))

    batch = [c.numpy() for c in clips(3)]
    spans = segment.as_array([segment.Segment(0, c.size, 0, c.size) for c in batch[:3]])
    requests = [Request({"samples": np.concatenate(batch[:3]), "segment_spans": spans}),
                Request({"samples": batch[3], "segment_spans": segment.as_array([segment.Segment(0, batch[3].size, 0, batch[3].size)])})]
    small, large = step(60), step(100000)
    calls = []
    small.forward = lambda cs, f=small.forward: calls.append(len(cs)) or f(cs)
    got, want = small.execute(requests), large.execute(requests)
    assert len(calls) >= 3 and sum(calls) == 4
    for g, w in zip(got, want):
        assert g["segment_frames"].tolist() == w["segment_frames"].tolist()
        assert np.array_equal(g["frame_ids"], w["frame_ids"])
        np.testing.assert_allclose(g["frame_logprobs"], w["frame_logprobs"], atol=1e-5)
