"""Qwen3-Omni's thinker against transformers on the tiny random checkpoint: the packed audio tower (each
clip's rows equal `get_audio_features` on that clip alone, packed or not), the pre step's prompt (the
processor's expansion of the audio placeholder), and the thinker's MoE decoder on our AR engine: first-step
logits and greedy tokens equal `Qwen3OmniMoeThinkerForConditionalGeneration.generate` for a text-only
prompt and for prompts with audio, all decoded together."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.parity
LENGTHS = (7000, 16000, 37123)        # under one chunk, one chunk, several attention windows
TOKENS = 8


def clips(seed: int = 0) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    return [(g.standard_normal(n) * (0.05 + 0.3 * np.abs(np.sin(np.arange(n) / 900.0)))).astype(np.float32)
            for n in LENGTHS]


@pytest.fixture(scope="module")
def folder():
    from tests.conftest import TINY
    from triton_omni.converters.tiny import build

    return build(TINY, ["qwen3_omni"])["qwen3_omni"]


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(folder)).eval()
    return model.thinker, AutoTokenizer.from_pretrained(str(folder)), WhisperFeatureExtractor.from_pretrained(str(folder))


def processor_inputs(reference, messages, waves):
    """What Qwen3OmniMoeProcessor makes of the messages and clips (its own class needs torchvision): the
    chat template, each clip's features (padding=True, no truncation) and its placeholder expanded to
    `_get_feat_extract_output_lengths` tokens."""
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    thinker, tokenizer, fe = reference
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = {}
    if waves:
        f = fe(waves, sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True, return_tensors="pt")
        counts = _get_feat_extract_output_lengths(f["attention_mask"].sum(-1), 50).tolist()
        pieces = text.split("<|audio_pad|>")
        assert len(pieces) == len(waves) + 1
        text = pieces[0] + "".join("<|audio_pad|>" * n + p for n, p in zip(counts, pieces[1:]))
        out = {"input_features": f["input_features"], "feature_attention_mask": f["attention_mask"]}
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), **out}


def audio_message(n: int, text: str = "What is said in this clip?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "audio"}] * n + [{"type": "text", "text": text}]}]


def test_packed_audio_tower_equals_transformers_clip_by_clip(folder, reference):
    from triton_omni.omni.audio import Qwen3OmniAudioEncoder, audio_tokens

    thinker, _, fe = reference
    ours = Qwen3OmniAudioEncoder.load(folder)
    batch = clips()
    with torch.inference_mode():
        packed, counts = ours([torch.from_numpy(c) for c in batch])
        at = 0
        for clip, n in zip(batch, counts):
            f = fe(clip, sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True,
                   return_tensors="pt")
            want = thinker.get_audio_features(f["input_features"], f["attention_mask"]).pooler_output
            alone, _ = ours([torch.from_numpy(clip)])
            assert [n] == audio_tokens([clip.size], ours.config) and n == want.shape[0]
            torch.testing.assert_close(packed[at:at + n], want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(packed[at:at + n], alone, rtol=1e-5, atol=1e-5)
            at += n


REQUESTS = [(7000, 5000), (7000, 16000, 37123), (37100, 37123), (16000,)]


def test_a_requests_clips_are_featurized_together_as_the_processor_does(folder, reference):
    """The processor pads a request's clips to the longest (features, then conv chunks): the rows of every
    request, all requests in one forward, equal get_audio_features on that request's batch."""
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    from triton_omni.omni.audio import Qwen3OmniAudioEncoder, audio_tokens, request_layout

    thinker, _, fe = reference
    ours = Qwen3OmniAudioEncoder.load(folder)
    g = np.random.default_rng(7)
    requests = [[(g.standard_normal(n) * 0.2).astype(np.float32) for n in lengths] for lengths in REQUESTS]
    clips_ = [torch.from_numpy(w) for r in requests for w in r]
    layouts = [c for r in requests for c in request_layout([w.size for w in r], ours.config)]
    with torch.inference_mode():
        packed, counts = ours(clips_, layouts)
        at = 0
        for r in requests:
            f = fe(r, sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True,
                   return_tensors="pt")
            want = thinker.get_audio_features(f["input_features"], f["attention_mask"]).pooler_output
            tokens = _get_feat_extract_output_lengths(f["attention_mask"].sum(-1), 50).tolist()
            assert audio_tokens([w.size for w in r], ours.config) == tokens and sum(tokens) == want.shape[0]
            torch.testing.assert_close(packed[at:at + want.shape[0]], want, rtol=1e-4, atol=1e-4)
            at += want.shape[0]
    assert at == packed.shape[0]


def engine_for(folder):
    from triton_omni.ar.step import ARParams, build_engine

    params = ARParams(checkpoint=str(folder), dtype="float32", max_num_seqs=8, max_model_len=1024)
    return build_engine(folder, params, "cpu", prompt_embeds=True)[0]


def test_thinker_logits_and_greedy_tokens_equal_transformers(folder, reference):
    """A text-only prompt and prompts with one and two clips, decoded together on the engine."""
    from triton_omni.ar.prompt_embeds import PromptEmbeds, placeholder_index
    from triton_omni.ar.sampling import SamplingParams
    from triton_omni.omni.audio import Qwen3OmniAudioEncoder

    thinker, _, _ = reference
    audio_id = thinker.config.audio_token_id
    encoder = Qwen3OmniAudioEncoder.load(folder)
    batch = clips(3)
    cases = [([{"role": "user", "content": "Describe the sound."}], []), (audio_message(1), batch[1:2]),
             (audio_message(2, "Transcribe the audio."), [batch[0], batch[2]])]
    engine = engine_for(folder)
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]   # the engine's stop ids too
    seqs, wants = [], []
    for messages, waves in cases:
        inputs = processor_inputs(reference, messages, waves)
        ids = inputs["input_ids"][0].numpy().astype(np.int64)
        with torch.inference_mode():
            logits = thinker(**inputs).logits[0, -1]
            want = thinker.generate(**inputs, max_new_tokens=TOKENS, do_sample=False, eos_token_id=eos)[0, ids.size:].tolist()
            rows = encoder([torch.from_numpy(w) for w in waves])[0] if waves else None
        embeds = PromptEmbeds(rows, placeholder_index(ids, [audio_id])) if rows is not None else None
        if rows is not None:
            assert rows.shape[0] == int((ids == audio_id).sum())
        seqs.append(engine.add(ids, SamplingParams(max_tokens=TOKENS, temperature=0.0), embeds=embeds))
        wants.append((logits, [t for t in want if t not in eos]))
    engine.run_until_done()
    assert all(len(s.output_ids) >= 3 for s in seqs)          # the tiny weights answer with a few tokens at least
    assert len({tuple(s.output_ids) for s in seqs}) == len(seqs)   # and the audio changes the answer
    for seq, (logits, want) in zip(seqs, wants):
        got = seq.output_ids
        assert got == want
        assert int(logits.argmax()) == (got[0] if got else int(logits.argmax()))


def test_pre_step_writes_the_processors_prompt(folder, reference):
    """The pre step's ids equal the processor's for a 2-clip question (each placeholder expanded by the
    request's features), its samples are the decoded clips, and a raw prompt with placeholders is refused."""
    from pathlib import Path

    from tests.asr_audio import encode_as
    from triton_omni.media.audio import decode
    from triton_omni.omni.steps import Qwen3OmniPre, Qwen3OmniPreParams
    from triton_omni.runtime.errors import InvalidInput
    from triton_omni.runtime.step import Request, StepContext, string_array

    step = Qwen3OmniPre(StepContext("pre", Qwen3OmniPreParams(checkpoint=str(folder)), "cpu", Path(".")))

    def one(req):
        (result,) = step.execute([req])
        if isinstance(result, BaseException):
            raise result
        return result

    wavs = [encode_as(c, 16000, "wav", "pcm_s16le") for c in clips(4)[:2]]
    messages = audio_message(2)
    out = one(Request({"messages": string_array(json.dumps(messages)), "audios": np.array(wavs, dtype=object)}))
    heard = [decode(w, 16000)[0] for w in wavs]
    want = processor_inputs(reference, messages, heard)["input_ids"][0]
    assert out["input_ids"].tolist() == want.tolist()
    assert out["audio_lengths"].tolist() == [h.size for h in heard]
    np.testing.assert_array_equal(out["audio_samples"], np.concatenate(heard))
    with pytest.raises(InvalidInput) as err:
        one(Request({"text_input": string_array("hi <|audio_pad|>")}))
    assert err.value.field == "text_input"
