"""The Cosmos3 text-to-video steps in-process (no server) against diffusers' `Cosmos3OmniPipeline` on
the tiny random checkpoint: the prompt's tokens as the pipeline makes them, the chained steps' final
latents and decoded frames (with and without CFG), clips batched in one call (different text
lengths, CFG and not) equal to each run alone, and the steps' own refusals."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_video_steps import Sink, fields, load_steps, run_chain, run_step
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request

MODEL = "cosmos3_t2v"


@pytest.fixture(scope="module")
def steps(tiny_checkpoints):
    loaded = load_steps(MODEL)
    yield loaded
    for s in loaded.values():
        s.close()


@pytest.fixture(scope="module")
def pipe(tiny_checkpoints):
    import diffusers
    from diffusers import Cosmos3OmniPipeline
    from transformers import AutoTokenizer

    from triton_omni.diffusion.checkpoint import load_component, load_scheduler

    diffusers.utils.logging.set_verbosity_error()
    folder = tiny_checkpoints[MODEL]
    # diffusers loads this transformer (time_embedder kept in float32) only through accelerate: the
    # reference gets ours, from the same files
    p = Cosmos3OmniPipeline(transformer=load_component(folder, "transformer"), vae=load_component(folder, "vae"),
                            scheduler=load_scheduler(folder), enable_safety_checker=False,
                            text_tokenizer=AutoTokenizer.from_pretrained(str(folder / "text_tokenizer")))
    p.set_progress_bar_config(disable=True)
    return p


def reference(pipe, output_type: str, seed: int, **kw):
    return pipe(generator=torch.Generator().manual_seed(seed), output_type=output_type, **kw).video


def test_pre_tokenizes_as_the_pipeline(steps, pipe):
    for frames, negative in ((9, "blurry"), (1, None), (17, "")):
        [out] = run_step(steps["pre"], [fields(prompt="a red fox", width=64, height=32, num_frames=frames, fps=8,
                                               guidance_scale=6.0, **({} if negative is None else
                                                                      {"negative_prompt": negative}))])
        cond, uncond = pipe.tokenize_prompt("a red fox", negative, num_frames=frames, height=32, width=64, fps=8)
        for row, want in zip(out["text_ids"], (cond, uncond)):
            assert row[:len(want)].tolist() == want and not row[len(want):].any()
        assert out["text_mask"].sum(axis=1).tolist() == [len(cond), len(uncond)]
    [out] = run_step(steps["pre"], [fields(prompt="a red fox", width=64, height=32, num_frames=9, guidance_scale=1.0)])
    assert out["text_ids"].shape[0] == 1                    # guidance 1: no CFG, no negative row


CASES = {   # name: (width, height, frames, fps, guidance)
    "cfg": (64, 32, 9, 24, 6.0),
    "no_cfg_odd_latent_side": (48, 32, 5, 10, 1.0),  # 3 latent columns: the transformer pads to its 2x2 patch;
                                                     #   10 fps: fractional time positions (2.4 a latent frame)
    "one_frame": (32, 64, 1, 24, 3.0),               # an image: the image templates, no fps modulation
}


@pytest.mark.parity
@pytest.mark.parametrize("case", list(CASES))
def test_latents_and_frames_equal_the_diffusers_pipeline(steps, pipe, case):
    width, height, frames, fps, guidance = CASES[case]
    request = dict(prompt="waves at dusk on a quiet beach", negative_prompt="blurry, dark", width=width,
                   height=height, num_frames=frames, fps=fps, num_inference_steps=4, guidance_scale=guidance, seed=7)
    calls = []
    hook = steps["denoise"].transformer.proj_in.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[0]))
    try:
        [out] = run_chain(steps, [fields(**request)])
    finally:
        hook.remove()
    kw = dict(prompt=request["prompt"], negative_prompt=request["negative_prompt"], width=width, height=height,
              num_frames=frames, fps=float(fps), num_inference_steps=4, guidance_scale=guidance, seed=7)
    want = reference(pipe, "latent", **kw)[0].numpy()
    assert out["latents"].shape == want.shape
    assert np.abs(out["latents"] - want).max() < 1e-4 * max(1.0, np.abs(want).max()), np.abs(out["latents"] - want).max()
    frames_ref = reference(pipe, "np", **kw)
    assert out["frames"].shape == (frames, height, width, 3)
    assert np.abs(out["frames"].astype(np.float64) - frames_ref * 255).max() <= 1.0
    # one call a step, its rows the conditional and (with CFG) the unconditional branch
    assert calls == [2 if guidance != 1.0 else 1] * 4


def submit(step, tensors: dict, request_id: str) -> Sink:
    sink = Sink()
    names = {t.name for t in step.inputs}
    step.submit(Request({k: v for k, v in tensors.items() if k in names}, request_id=request_id), sink)
    return sink


def test_clips_batched_together_equal_each_alone(steps):
    step = steps["denoise"]
    requests = [fields(prompt=p, width=64, height=32, num_frames=9, num_inference_steps=3, guidance_scale=g, seed=s)
                for p, g, s in (("sun", 6.0, 1), ("the moon over a long quiet lake at night", 1.0, 2))]
    inputs = run_chain(steps, requests, until="text_encoder")
    assert inputs[0]["prompt_embeds"].shape[0] != inputs[1]["prompt_embeds"].shape[0]     # padded, masked
    alone = [submit(step, x, f"alone{i}").result()["latents"] for i, x in enumerate(inputs)]
    calls = step.loop.stats.model_calls
    step.loop.stats.max_call_clips = 0
    together = [s.result()["latents"] for s in [submit(step, x, f"together{i}") for i, x in enumerate(inputs)]]
    assert step.loop.stats.max_call_clips == 2 and step.loop.stats.model_calls - calls == 3
    for a, t in zip(alone, together):
        assert np.abs(a - t).max() < 1e-4 * max(1.0, np.abs(a).max())
    assert np.abs(together[0] - together[1]).max() > 1e-2


def test_steps_refuse_what_they_cannot_take(steps):
    [err] = steps["pre"].execute([Request(fields(prompt="a fox", size="40x32", num_frames=9))])
    assert isinstance(err, InvalidInput) and err.field == "size" and "multiples of 16" in str(err), err
    [err] = steps["pre"].execute([Request(fields(prompt="fox " * 2000, size="64x32", num_frames=9))])
    assert isinstance(err, InvalidInput) and err.field == "prompt" and "tokens" in str(err), err
    ids = np.array([[5, 6, 0, 7]], np.int32)
    [err, ok] = steps["text_encoder"].execute([
        Request({"text_ids": ids, "text_mask": np.array([[1, 0, 1, 1]], np.int32)}),
        Request({"text_ids": ids, "text_mask": np.array([[1, 1, 0, 0]], np.int32)})])
    assert isinstance(err, InvalidInput) and err.field == "text_mask", err
    assert ok["prompt_embeds"].shape == (2, steps["denoise"].text_dim)
    [good] = run_chain(steps, [fields(prompt="x", width=64, height=32, num_frames=9, num_inference_steps=2,
                                      guidance_scale=6.0, seed=1)], until="text_encoder")
    bad = [({"prompt_embeds": np.zeros((4, 7), np.float32)}, "prompt_embeds", "values a token"),
           ({"negative_embeds": np.zeros((0, steps["denoise"].text_dim), np.float32)}, "negative_embeds", "CFG"),
           ({"num_frames": np.array([8], np.int32)}, "num_frames", "1 + a multiple of 4"),
           ({"width": np.array([40], np.int32)}, "width", "multiples of 16")]
    for change, field, reason in bad:
        with pytest.raises(InvalidInput) as err:
            run_step(steps["denoise"], [{**good, **change}])
        assert err.value.field == field and reason in str(err.value), str(err.value)


def test_the_text_encoder_batches_requests_and_equals_each_alone(steps):
    step = steps["text_encoder"]
    requests = [fields(prompt=p, width=64, height=32, num_frames=9, guidance_scale=g)
                for p, g in (("sun", 6.0), ("the moon over a long quiet lake at night", 1.0), ("a fox", 3.0))]
    tokens = run_chain(steps, requests, until="pre")
    alone = [run_step(step, [t])[0] for t in tokens]
    calls = []
    hook = step.text_encoder.embed_tokens.register_forward_hook(lambda m, a, o: calls.append(tuple(a[0].shape)))
    try:
        together = run_step(step, tokens)
    finally:
        hook.remove()
    longest = max(int(t["text_mask"].sum(axis=1).max()) for t in tokens)
    assert calls == [(5, longest)]          # 5 rows (2 + 1 + 2) in one call, cut after the longest
    for a, t in zip(alone, together):
        for name in ("prompt_embeds", "negative_embeds"):
            assert a[name].shape == t[name].shape
            assert np.abs(a[name] - t[name]).max(initial=0) < 1e-5 * max(1.0, np.abs(a[name]).max(initial=0))
    assert together[1]["negative_embeds"].shape[0] == 0 and together[2]["negative_embeds"].shape[0] > 0
