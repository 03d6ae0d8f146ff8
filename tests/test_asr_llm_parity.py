"""The speech-recognition models with an LLM decoder against transformers on their tiny random
checkpoints: the packed audio encoders (each clip's prompt embeddings equal the reference's on that clip
alone; a packed batch of different lengths equal to each clip alone), the pre steps' prompts (the
processors' own input ids), and the whole model: its first-step logits and greedy tokens on our AR
engine equal `generate` of `Qwen3ASRForConditionalGeneration` / `OmniASRForConditionalGeneration`, and
requests of different lengths decoded together equal each decoded alone."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from triton_omni.asr.features import normalize_clips, whisper_log_mel
from triton_omni.runtime.step import Request, StepContext, string_array

pytestmark = pytest.mark.parity
LENGTHS = (3000, 16000, 37123, 52000)        # 0.19 s (padded to 0.5 s by the reference), 1 s, several windows


def clips(seed: int = 0) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    return [(g.standard_normal(n) * (0.05 + 0.3 * np.abs(np.sin(np.arange(n) / 900.0)))).astype(np.float32)
            for n in LENGTHS]


@pytest.fixture(scope="module")
def qwen3_folder(tiny_checkpoints):
    return tiny_checkpoints["qwen3_asr"]


@pytest.fixture(scope="module")
def omni_folder(tiny_checkpoints):
    return tiny_checkpoints["omniasr_llm"]


@pytest.fixture(scope="module")
def qwen3_reference(qwen3_folder):
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    return Qwen3ASRForConditionalGeneration.from_pretrained(str(qwen3_folder)).eval(), \
        AutoProcessor.from_pretrained(str(qwen3_folder))


@pytest.fixture(scope="module")
def omni_reference(omni_folder):
    from transformers import AutoProcessor, OmniASRForConditionalGeneration

    return OmniASRForConditionalGeneration.from_pretrained(str(omni_folder)).eval(), \
        AutoProcessor.from_pretrained(str(omni_folder))


def test_whisper_log_mel_equals_the_feature_extractor(qwen3_reference):
    from triton_omni.media.audio_signal import mel_filters

    _, processor = qwen3_reference
    fe = processor.feature_extractor
    batch = clips()
    packed = whisper_log_mel([torch.from_numpy(np.pad(c, (0, max(0, 8000 - c.size)))) for c in batch],
                             torch.from_numpy(mel_filters(16000, 400, 128, 0.0, 8000.0)))
    at = 0
    for clip in batch:
        want = fe(clip, sampling_rate=16000, padding=True, return_attention_mask=True)
        n = int(want["attention_mask"].sum())
        torch.testing.assert_close(packed[:, at:at + n], want["input_features"][0, :, :n], rtol=1e-5, atol=1e-5)
        at += n
    assert at == packed.shape[1]


def test_qwen3_asr_packed_encoder_equals_transformers_clip_by_clip(qwen3_folder, qwen3_reference):
    from triton_omni.asr.qwen3_asr.model import Qwen3ASRAudioEncoder, audio_tokens

    model, processor = qwen3_reference
    ours = Qwen3ASRAudioEncoder.load(qwen3_folder)
    batch = clips()
    with torch.inference_mode():
        packed, counts = ours([torch.from_numpy(c) for c in batch])
        at = 0
        for clip, n in zip(batch, counts):
            f = processor.feature_extractor(clip, sampling_rate=16000, padding=True, return_attention_mask=True)
            want = model.model.get_audio_features(f["input_features"], f["attention_mask"]).pooler_output
            alone, _ = ours([torch.from_numpy(clip)])
            assert n == audio_tokens(clip.size, ours.config) == want.shape[0]
            torch.testing.assert_close(packed[at:at + n], want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(packed[at:at + n], alone, rtol=1e-5, atol=1e-5)
            at += n


def test_omniasr_llm_packed_encoder_equals_transformers_clip_by_clip(omni_folder, omni_reference):
    from triton_omni.asr.omniasr.model import OmniASRLLMEncoder, PackedClips

    model, processor = omni_reference
    ours = OmniASRLLMEncoder.load(omni_folder)
    batch = clips()
    with torch.inference_mode():
        packed = PackedClips.build(normalize_clips([torch.from_numpy(c) for c in batch]), ours.audio)
        got = ours(packed).split(packed.frames)
        for clip, rows in zip(batch, got):
            inputs = processor.apply_transcription_request(clip, language="en")
            want = model.model.get_audio_features(inputs["input_values"], inputs["padding_mask"]).pooler_output
            assert rows.shape == want.shape == (ours.audio.frames(clip.size), model.config.text_config.hidden_size)
            torch.testing.assert_close(rows, want, rtol=1e-4, atol=1e-4)


def pre_step(cls, folder, **params):
    from triton_omni.asr.llm_pre import LLMASRPreParams

    return cls(StepContext("pre", LLMASRPreParams(checkpoint=str(folder), segmentation="window", **params), "cpu", Path(".")))


def wav_request(wave: np.ndarray, **strings) -> Request:
    from tests.asr_audio import encode_as

    data = encode_as(wave, 16000, "wav", "pcm_s16le")
    return Request({"audio": np.array([data], dtype=object), **{k: string_array(v) for k, v in strings.items()}})


@pytest.mark.parametrize("language, prompt", [(None, None), ("en", "Triton, ensembles"), ("zh", None)])
def test_qwen3_asr_pre_writes_the_processors_prompt(qwen3_folder, qwen3_reference, language, prompt):
    from triton_omni.asr.qwen3_asr.steps import Qwen3ASRPre
    from triton_omni.media.audio import decode

    _, processor = qwen3_reference
    wave = clips()[2]
    req = wav_request(wave, **({"language": language} if language else {}), **({"prompt": prompt} if prompt else {}))
    out = pre_step(Qwen3ASRPre, qwen3_folder).one(req)
    heard = decode(req.get("audio").reshape(-1)[0], 16000)[0]
    want = processor.apply_transcription_request(heard, language=language, prompt=prompt)["input_ids"][0]
    assert out["input_ids"].tolist() == want.tolist() and out["prompt_lens"].tolist() == [want.numel()]


@pytest.mark.parametrize("language", [None, "en", "fra_Latn"])
def test_omniasr_llm_pre_writes_the_processors_prompt(omni_folder, omni_reference, language):
    from triton_omni.asr.omniasr.steps import OmniASRLLMPre
    from triton_omni.media.audio import decode

    _, processor = omni_reference
    req = wav_request(clips()[1], **({"language": language} if language else {}))
    out = pre_step(OmniASRLLMPre, omni_folder, prompt=False).one(req)
    heard = decode(req.get("audio").reshape(-1)[0], 16000)[0]
    want = processor.apply_transcription_request(heard, language=language)["input_ids"][0]
    assert out["input_ids"].tolist() == list(want)


def test_pre_steps_refuse_what_the_model_cannot_do(qwen3_folder, omni_folder):
    from triton_omni.asr.omniasr.steps import OmniASRLLMPre
    from triton_omni.asr.qwen3_asr.steps import Qwen3ASRPre
    from triton_omni.runtime.errors import InvalidInput

    qwen, omni = pre_step(Qwen3ASRPre, qwen3_folder), pre_step(OmniASRLLMPre, omni_folder, prompt=False)
    wave = clips()[1]
    cases = [(qwen, {"language": "tlh"}, "language"), (omni, {"language": "xx"}, "language"),
             (omni, {"prompt": "context"}, "prompt"), (qwen, {"timestamp_granularities": "word"}, "timestamp_granularities")]
    for step, strings, field in cases:
        with pytest.raises(InvalidInput) as e:
            step.one(wav_request(wave, **strings))
        assert e.value.field == field


# -- the whole model on the AR engine -------------------------------------------------------------
TOKENS = 8


def engine_for(folder):
    from triton_omni.ar.step import ARParams, build_engine

    params = ARParams(checkpoint=str(folder), dtype="float32", max_num_seqs=8, max_model_len=1024)
    return build_engine(folder, params, "cpu", prompt_embeds=True)[0]


def prompts_and_rows(pre, encoder, waves: list[np.ndarray], **strings):
    """Our pre step's prompt and our encoder step's rows for each clip (one segment each)."""
    outs = [pre.one(wav_request(w, **strings)) for w in waves]
    rows = encoder.execute([Request(o) for o in outs])
    return [(o["input_ids"], torch.from_numpy(r["prompt_embeds"])) for o, r in zip(outs, rows)]


def greedy_on_engine(engine, cases, audio_token_id) -> list[list[int]]:
    """Every case's greedy tokens, all of them decoded together on the engine."""
    from triton_omni.ar.prompt_embeds import PromptEmbeds, placeholder_index
    from triton_omni.ar.sampling import SamplingParams

    seqs = [engine.add(ids, SamplingParams(max_tokens=TOKENS, temperature=0.0),
                       embeds=PromptEmbeds(rows, placeholder_index(ids, [audio_token_id]))) for ids, rows in cases]
    engine.run_until_done()
    return [s.output_ids for s in seqs]


def encoder_step(cls, params_cls, folder):
    return cls(StepContext("encoder", params_cls(checkpoint=str(folder)), "cpu", Path(".")))


def test_qwen3_asr_greedy_tokens_equal_generate_and_batched_equals_alone(qwen3_folder, qwen3_reference):
    from triton_omni.asr.qwen3_asr.steps import Qwen3ASREncoderParams, Qwen3ASREncoderStep, Qwen3ASRPre
    from triton_omni.media.audio import decode

    model, processor = qwen3_reference
    pre = pre_step(Qwen3ASRPre, qwen3_folder)
    encoder = encoder_step(Qwen3ASREncoderStep, Qwen3ASREncoderParams, qwen3_folder)
    waves = clips(5)[1:]
    cases = prompts_and_rows(pre, encoder, waves, language="en")
    engine = engine_for(qwen3_folder)
    together = greedy_on_engine(engine, cases, model.config.audio_token_id)
    for wave, (ids, rows), got in zip(waves, cases, together):
        heard = decode(wav_request(wave).get("audio").reshape(-1)[0], 16000)[0]
        inputs = processor.apply_transcription_request(heard, language="en")
        with torch.inference_mode():
            want = model.generate(**inputs, max_new_tokens=TOKENS, do_sample=False)[0, inputs["input_ids"].shape[1]:]
            logits = model(**inputs).logits[0, -1]
        want = [t for t in want.tolist() if t not in model.config.eos_token_id]
        assert got == want
        assert int(logits.argmax()) == (got[0] if got else int(logits.argmax()))
        assert greedy_on_engine(engine, [(ids, rows)], model.config.audio_token_id)[0] == got      # alone


def test_omniasr_llm_greedy_tokens_equal_generate_and_batched_equals_alone(omni_folder, omni_reference):
    from triton_omni.asr.omniasr.steps import OmniASRLLMEncoderParams, OmniASRLLMEncoderStep, OmniASRLLMPre
    from triton_omni.media.audio import decode

    model, processor = omni_reference
    pre = pre_step(OmniASRLLMPre, omni_folder, prompt=False)
    encoder = encoder_step(OmniASRLLMEncoderStep, OmniASRLLMEncoderParams, omni_folder)
    waves = clips(6)[1:]
    cases = prompts_and_rows(pre, encoder, waves, language="en")
    engine = engine_for(omni_folder)
    together = greedy_on_engine(engine, cases, model.config.audio_token_id)
    for wave, case, got in zip(waves, cases, together):
        heard = decode(wav_request(wave).get("audio").reshape(-1)[0], 16000)[0]
        inputs = processor.apply_transcription_request(heard, language="en", return_tensors="pt")
        with torch.inference_mode():
            want = model.generate(**inputs, max_new_tokens=TOKENS, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        want = [t for t in want.tolist() if t != model.config.eos_token_id]
        assert got == want
        assert greedy_on_engine(engine, [case], model.config.audio_token_id)[0] == got
