"""The vision models in-process on their tiny checkpoints, against transformers: Qwen3.5's processor,
rope positions, vision tower (packed and one by one) and greedy answers to image and video questions
on the AR engine with spliced embeddings; V-JEPA2's encoder; Qwen3-Embedding's text embeddings."""
from __future__ import annotations

import base64
import dataclasses

import numpy as np
import pytest
import torch

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.prompt_embeds import PromptEmbeds, placeholder_index
from triton_omni.ar.sampling import SamplingParams
from triton_omni.media.video_decode import VideoDecodeError, decode_video
from triton_omni.models.registry import load_causal_lm
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request
from triton_omni.vision.qwen3_5_vl import processor as proc
from tests import vision_cases as vc

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def folder(tiny_checkpoints):
    return tiny_checkpoints["qwen3_5_vl"]


@pytest.fixture(scope="module")
def steps(folder):
    return vc.load_steps("qwen3_5_vl_chat", ["pre", "vision"])


@pytest.fixture(scope="module")
def hf(folder):
    from transformers import Qwen3_5ForConditionalGeneration

    return Qwen3_5ForConditionalGeneration.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def prepared(steps):
    """Pre-step outputs: an image question per test size, a video question, a text-only question."""
    reqs = [vc.pre_request(vc.user(vc.IMAGE_Q), images=[vc.image(h, w, seed=i)]) for i, (h, w) in enumerate(vc.IMAGE_SIZES)]
    reqs += [vc.pre_request(vc.user(vc.VIDEO_Q), videos=[vc.video()]), vc.pre_request(vc.user("Describe the sea."))]
    outs = steps["pre"].execute(reqs)
    assert not [o for o in outs if isinstance(o, BaseException)], outs
    return outs


def vision(steps, outs) -> list[np.ndarray]:
    res = steps["vision"].execute([Request({"pixels": o["pixels"], "grid_thw": o["grid_thw"]}) for o in outs])
    assert not [r for r in res if isinstance(r, BaseException)], res
    return [r["prompt_embeds"] for r in res]


def test_image_patches_match_the_image_processor(folder):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from triton_omni.media.image import decode_pixels

    reference = Qwen2VLImageProcessorPil.from_pretrained(folder)
    layout = proc.load_layout(folder)
    scale, shift = 1 / (255 * np.repeat(layout.image_std, 512)), -np.repeat(layout.image_mean, 512) / np.repeat(layout.image_std, 512)
    for h, w in vc.IMAGE_SIZES:
        rgb = decode_pixels(vc.image(h, w))
        patches, grid = proc.image_patches(rgb, layout, 1 << 30)
        ref = reference(images=[rgb], return_tensors="np")
        assert [list(grid)] == ref["image_grid_thw"].tolist()
        np.testing.assert_allclose(patches * scale + shift, ref["pixel_values"], atol=1e-5)


def test_prompt_ids_match_the_processor(folder, steps, prepared):
    """The pre step's ids for an image question are what Qwen3VLProcessor makes of the same template
    text and image; video timestamps are its `_calculate_timestamps`."""
    import transformers
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from triton_omni.media.image import decode_pixels

    class ImageOnly(transformers.Qwen3VLProcessor):       # its video processor needs torchvision
        def check_argument_for_proper_class(self, name, arg):
            return None if name == "video_processor" else super().check_argument_for_proper_class(name, arg)

    tok = AutoTokenizer.from_pretrained(folder)
    processor = ImageOnly(image_processor=Qwen2VLImageProcessorPil.from_pretrained(folder), tokenizer=tok,
                          video_processor=None)
    text = tok.apply_chat_template([{"role": "user", "content": vc.IMAGE_Q}], add_generation_prompt=True, tokenize=False)
    h, w = vc.IMAGE_SIZES[0]
    ref = processor(text=[text], images=[decode_pixels(vc.image(h, w, seed=0))], return_tensors="np")
    assert prepared[0]["input_ids"].tolist() == ref["input_ids"][0].tolist()
    indices = np.array([0, 2, 4, 7, 9])
    assert proc.timestamps(indices, 4.0, 2) == transformers.Qwen3VLProcessor._calculate_timestamps(None, indices, 4.0, 2)


def test_rope_positions_match_get_rope_index(hf, steps, prepared):
    for out in (prepared[0], prepared[3], prepared[-2], prepared[-1]):        # images, video, text only
        kw = vc.hf_inputs(out, steps["vision"].tower, hf.config)
        pos, delta = hf.model.get_rope_index(kw["input_ids"], kw["mm_token_type_ids"], kw.get("image_grid_thw"),
                                             kw.get("video_grid_thw"))
        assert np.array_equal(pos[:, 0].numpy(), out["rope_positions"])
        embeds = PromptEmbeds(torch.zeros(0, 1), np.zeros(0, np.int64), out["rope_positions"].astype(np.int64))
        assert embeds.rope_delta == int(delta)


def test_tower_packs_every_request_and_matches_transformers(hf, steps, prepared):
    """One execute over all requests (8 image sizes, a video, a text-only request: one packed tower call)
    gives each request what it gets alone, and what transformers' tower gives."""
    runner = steps["vision"].runner
    before = runner.executions
    packed = vision(steps, prepared)
    assert runner.executions == before + 1
    for out, rows in zip(prepared, packed):
        alone = vision(steps, [out])[0]
        np.testing.assert_allclose(rows, alone, atol=1e-4, rtol=1e-5)
        if out["grid_thw"].size:
            kw = vc.hf_inputs(out, steps["vision"].tower, hf.config)
            pixels = kw.get("pixel_values", kw.get("pixel_values_videos"))
            grid = kw.get("image_grid_thw", kw.get("video_grid_thw"))
            with torch.no_grad():
                ref = torch.cat(hf.model.get_image_features(pixels, grid).pooler_output).numpy()
            np.testing.assert_allclose(rows, ref, atol=1e-4, rtol=1e-4)
        else:
            assert rows.shape == (0, hf.config.text_config.hidden_size)


def test_tower_bucket_layout_equals_eager(steps, prepared):
    """What a tower graph replays (the packed step padded to a bucket, padding as its own segment), run
    eagerly: the real rows are the eager call's."""
    step = steps["vision"]
    jobs = [step.job(Request({"pixels": o["pixels"], "grid_thw": o["grid_thw"]})) for o in prepared[:3]]
    from triton_omni.vision.packed import PackedStep
    packed = PackedStep({k: np.concatenate([j.tokens[k] for j in jobs]) for k in jobs[0].tokens},
                        [n for j in jobs for n in j.seg_lens])
    with torch.inference_mode():
        eager = step.runner.eager(packed)
        bucket = step.runner.run_bucket_eagerly(packed, 256)
    assert packed.num_tokens < 256
    torch.testing.assert_close(bucket[:eager.shape[0]], eager, atol=1e-5, rtol=1e-5)


def engine_for(folder, **kw) -> LLMEngine:
    model = load_causal_lm(folder, "cpu", torch.float32)
    return LLMEngine(model, EngineConfig(**{"max_num_seqs": 4, "max_model_len": 512, **kw}), "cpu", torch.float32,
                     [], model.config.vocab_size, prompt_embeds=True)


def spliced(hf, out: dict, rows: np.ndarray) -> PromptEmbeds:
    ids = [hf.config.image_token_id, hf.config.video_token_id]
    return PromptEmbeds(torch.from_numpy(rows), placeholder_index(out["input_ids"], ids), out["rope_positions"].astype(np.int64))


def test_greedy_answers_to_image_and_video_questions_match_transformers(folder, hf, steps, prepared):
    """An image, a video and a text-only question decoded together on the engine (spliced embeddings,
    multimodal rope at prefill and decode) give transformers' greedy tokens for each."""
    chosen = [prepared[0], prepared[2], prepared[-2], prepared[-1]]
    rows = vision(steps, chosen)
    engine = engine_for(folder)
    params = SamplingParams(max_tokens=vc.GREEDY["max_tokens"], temperature=0, ignore_eos=True)
    seqs = [engine.add(o["input_ids"], params, embeds=spliced(hf, o, r)) for o, r in zip(chosen, rows)]
    engine.run_until_done()
    for out, seq in zip(chosen, seqs):
        assert seq.output_ids == vc.hf_greedy(hf, out, steps["vision"].tower)
    # n = 2: the fork decodes from its parent's prefill at the parent's rope positions
    seq = engine.add(chosen[0]["input_ids"], dataclasses.replace(params, n=2), embeds=spliced(hf, chosen[0], rows[0]))
    engine.run_until_done()
    assert seq.output_ids == seq.forks[0].output_ids == seqs[0].output_ids


def test_spliced_prefill_graph_layout_equals_eager_prefill(hf, steps, prepared):
    """The prefill graph's inputs for spliced prompts (embeddings in the static buffer, rope rows after
    the other inputs), run eagerly: each prompt's last hidden state as the eager prefill's. (On a
    Qwen3.5 layout of attention layers only: its Gated DeltaNet layers prefill in a graph only through
    their kernels, which the CPU would interpret for minutes.)"""
    from transformers import Qwen3_5TextConfig
    from triton_omni.models.qwen3_5 import Qwen3_5ForCausalLM

    text = hf.config.text_config.to_dict()
    text.update(layer_types=["full_attention"] * 2, num_hidden_layers=2)
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{k: v for k, v in text.items() if k in Qwen3_5TextConfig.__dataclass_fields__}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    engine = LLMEngine(model.eval(), EngineConfig(max_num_seqs=4, max_model_len=512, cuda_graph_prefill_tokens=[128]),
                       "cpu", torch.float32, [], model.config.vocab_size, prompt_embeds=True)
    chosen = [prepared[1], prepared[-1], prepared[-2]]
    for o, r in zip(chosen, vision(steps, chosen)):
        engine.add(o["input_ids"], SamplingParams(max_tokens=2, temperature=0), embeds=spliced(hf, o, r))
    engine._drain_inbox()
    seqs = engine.scheduler.schedule().seqs
    engine.runner.admit(seqs, set())
    with torch.inference_mode():
        eager = engine.runner.prefill_hidden(seqs).clone()
        bucket = engine.runner.bucket_prefill_hidden(seqs, 128)
    assert sum(s.prompt_len for s in seqs) < 128
    torch.testing.assert_close(bucket, eager, atol=1e-5, rtol=1e-5)


def test_the_engine_refuses_embeddings_that_do_not_fit(folder, hf, prepared):
    engine, out = engine_for(folder), prepared[0]
    good = spliced(hf, out, np.zeros((int((out["input_ids"] == hf.config.image_token_id).sum()), 64), np.float32))
    params = SamplingParams(max_tokens=2)
    cases = {"prompt_embeds": [PromptEmbeds(good.embeds[1:], good.index, good.rope_positions),
                               PromptEmbeds(torch.zeros(len(good.index), 8), good.index, good.rope_positions)],
             "rope_positions": [PromptEmbeds(good.embeds, good.index, good.rope_positions[:2]),
                                PromptEmbeds(good.embeds, good.index, good.rope_positions + 1000)]}
    for field, bad in cases.items():
        for e in bad:
            with pytest.raises(InvalidInput) as err:
                engine.add(out["input_ids"], params, embeds=e)
            assert err.value.field == field
    text_engine = LLMEngine(load_causal_lm(folder, "cpu", torch.float32), EngineConfig(max_num_seqs=2, max_model_len=256),
                            "cpu", torch.float32, [], hf.config.text_config.vocab_size)
    with pytest.raises(InvalidInput, match="no prompt embeddings"):
        text_engine.add(out["input_ids"], params, embeds=good)


def test_pre_step_errors_name_the_field(steps, tiny_checkpoints):
    png, mp4 = vc.image(40, 40), vc.video()
    data_url = "data:image/png;base64," + base64.b64encode(png).decode()
    big = vc.image(300, 300)            # more than the YAML's upload budget once lowered below
    pre = steps["pre"]
    cases = [
        (vc.pre_request(vc.user(vc.IMAGE_Q), images=[b"not an image"]), "images[0]", "not a recognised image"),
        (vc.pre_request(vc.user(vc.IMAGE_Q), images=[png[:len(png) // 2]]), "images[0]", "corrupt or truncated"),
        (vc.pre_request(vc.user(vc.VIDEO_Q), videos=[b""]), "videos[0]", "empty video"),
        (vc.pre_request(vc.user(vc.VIDEO_Q), videos=[b"\x00" * 500]), "videos[0]", "not a recognised video"),
        (vc.pre_request(vc.user([{"type": "input_audio", "input_audio": {}}])), "messages[0].content[0]", "unsupported"),
        (vc.pre_request(vc.user([{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}])),
         "messages[0].content[0].image_url", "remote URLs"),
        (vc.pre_request(vc.user([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}])),
         "messages[0].content[0].image_url", "not valid base64"),
        (vc.pre_request(vc.user([{"type": "image_url", "image_url": {"url": data_url}}] * 9)), "messages", "at most 8"),
        (vc.pre_request(vc.user(vc.IMAGE_Q)), "messages[0].content[0]", "no images[0]"),
        (vc.pre_request(vc.user("hi"), images=[png]), "images", "1 given, 0 referenced"),
        (vc.pre_request(vc.user(vc.VIDEO_Q), videos=[mp4], sampling={"max_tokens": 0}), "sampling_parameters.max_tokens", ""),
    ]
    results = pre.execute([c[0] for c in cases] + [vc.pre_request(vc.user(vc.IMAGE_Q), images=[png])])
    for (_, field, words), got in zip(cases, results):
        assert isinstance(got, InvalidInput) and got.field == field and words in str(got), (field, got)
    assert isinstance(results[-1], dict) and results[-1]["grid_thw"].shape == (1, 3)     # the neighbour
    saved = pre.params.max_upload_pixels
    pre.params.max_upload_pixels = 200 * 200
    try:
        (got,) = pre.execute([vc.pre_request(vc.user(vc.IMAGE_Q), images=[big])])
    finally:
        pre.params.max_upload_pixels = saved
    assert isinstance(got, InvalidInput) and got.field == "images[0]" and "at most 40000 pixels" in str(got)


def test_vision_step_refuses_tensors_that_disagree(steps, prepared):
    out = prepared[0]
    bad = [({"pixels": out["pixels"][1:], "grid_thw": out["grid_thw"]}, "pixels"),
           ({"pixels": out["pixels"], "grid_thw": out["grid_thw"] + [[0, 1, 0]]}, "grid_thw")]
    results = steps["vision"].execute([Request(t) for t, _ in bad] + [Request({"pixels": out["pixels"], "grid_thw": out["grid_thw"]})])
    for (_, field), got in zip(bad, results):
        assert isinstance(got, InvalidInput) and got.field == field
    assert results[-1]["prompt_embeds"].shape[0] == out["pixels"].shape[0] // 4


def test_video_frames_are_sampled_at_the_asked_rate_and_bad_files_refused():
    clip = vc.video(frames=10, fps=4)
    v = decode_video(clip, fps=2.0)
    assert v.total_frames == 10 and v.fps == 4.0 and v.indices.tolist() == [0, 2, 4, 7, 9] and len(v.frames) == 5
    assert decode_video(clip, fps=None, num_frames=3).indices.tolist() == [0, 4, 9]
    assert len(decode_video(clip, fps=2.0, max_frames=2).frames) == 2
    for data, words in [(b"", "empty"), (b"garbage" * 20, "not a recognised video"), (clip[:300], None)]:
        with pytest.raises(VideoDecodeError, match=words):
            decode_video(data)


# -- V-JEPA2 ---------------------------------------------------------------------------------------
def test_vjepa2_clips_packed_match_transformers(tiny_checkpoints):
    """Two clips of different lengths in one encoder call: each one's per-patch embeddings are
    transformers' VJEPA2Model encoder outputs for its pixels, its embedding their mean."""
    from transformers import VJEPA2Model

    steps = vc.load_steps("vjepa2_embed", ["pre", "encode"])
    clips = [(vc.video(frames=8, h=48, w=64, fps=4, seed=3), 8), (vc.video(frames=5, h=40, w=40, fps=4, seed=4), 3)]
    pre = [steps["pre"].one(Request({"video": vc.strings(v), "num_frames": np.array([n], np.int32)})) for v, n in clips]
    before = steps["encode"].runner.executions
    res = steps["encode"].execute([Request(p) for p in pre])
    assert steps["encode"].runner.executions == before + 1
    hf = VJEPA2Model.from_pretrained(tiny_checkpoints["vjepa2"]).eval()
    layout = steps["pre"].layout
    g = layout.crop // layout.patch
    for p, r, (_, n) in zip(pre, res, clips):
        frames = -(-n // layout.tubelet) * layout.tubelet
        x = p["pixels"].reshape(frames // layout.tubelet, g, g, 3, layout.tubelet, layout.patch, layout.patch)
        x = x.transpose(0, 4, 1, 5, 2, 6, 3).reshape(frames, layout.crop, layout.crop, 3)
        mean, std = torch.tensor(layout.mean)[:, None, None], torch.tensor(layout.std)[:, None, None]
        pixels = ((torch.from_numpy(x).float().permute(0, 3, 1, 2) / 255 - mean) / std)[None]
        with torch.no_grad():
            ref = hf.get_vision_features(pixels)[0].numpy()
        np.testing.assert_allclose(r["patch_embeddings"], ref, atol=1e-4)
        np.testing.assert_allclose(r["embedding"], ref.mean(0), atol=1e-5)


def test_text_embeddings_batched_match_transformers_one_by_one(tiny_checkpoints):
    from transformers import AutoModel, AutoTokenizer

    step = vc.load_steps("qwen3_embed", ["embed"])["embed"]
    texts = ["Triton serves models", "The quick brown fox jumps over the lazy dog", "hi"]
    res = step.execute([Request({"text": vc.strings(t)}) for t in texts] + [Request({"text": vc.strings("")})])
    assert isinstance(res[-1], InvalidInput) and res[-1].field == "text"
    folder = tiny_checkpoints["qwen3_embedding"]
    model, tok = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    for text, r in zip(texts, res):
        ids = tok(text, return_tensors="pt")
        assert ids["input_ids"][0, -1] == tok.convert_tokens_to_ids("<|endoftext|>")
        with torch.no_grad():
            ref = torch.nn.functional.normalize(model(**ids).last_hidden_state[0, -1], dim=-1).numpy()
        np.testing.assert_allclose(r["embedding"], ref, atol=1e-5)
        assert r["prompt_tokens"][0] == ids["input_ids"].shape[1]
