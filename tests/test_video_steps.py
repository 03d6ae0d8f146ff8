"""The video steps in-process (no server): request checks, MP4 encoding, and the chained Wan2.2 steps
against diffusers' pipelines on the tiny random checkpoints (latents and decoded frames), for T2V with
the A14B two-expert switch, TI2V-5B from text and from text + a first frame, and I2V-A14B; then the
denoise loop itself: clips batched together or joining mid-way equal clips run alone, progress,
cancellation."""
from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from triton_omni.converters.schema import load_ensemble
from triton_omni.media.video import decode_video, encode_mp4
from triton_omni.runtime.errors import Cancelled, InvalidInput, Unavailable
from triton_omni.runtime.params import parse_params
from triton_omni.runtime.step import Request, ResponseSink, StepContext
from triton_omni.video.request import VideoLimits, parse_request

ROOT = Path(__file__).resolve().parent.parent
TYPES = {"prompt": object, "negative_prompt": object, "size": object, "image": object, "width": np.int32,
         "height": np.int32, "num_frames": np.int32, "seconds": np.float32, "fps": np.int32,
         "num_inference_steps": np.int32, "guidance_scale": np.float32, "guidance_scale_2": np.float32,
         "seed": np.int64, "abort_request_id": object, "progress_request_id": object}


def fields(**values) -> dict:
    return {k: np.array([v.encode() if isinstance(v, str) else v], dtype=TYPES[k]) for k, v in values.items()}


def png(width: int, height: int, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


class Sink(ResponseSink):
    """Collects a decoupled step's responses for one request."""

    def __init__(self, on_send=None):
        self.responses, self.error_seen, self.done, self.on_send = [], None, threading.Event(), on_send

    def send(self, outputs, final=False):
        self.responses.append(outputs)
        if self.on_send:
            self.on_send(outputs)
        if final:
            self.done.set()

    def error(self, exc):
        self.error_seen = exc
        self.done.set()

    def result(self, timeout: float = 60) -> dict:
        assert self.done.wait(timeout), "no final response"
        if self.error_seen is not None:
            raise self.error_seen
        return self.responses[-1]


def load_steps(name: str, **overrides) -> dict:
    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{name}.yaml")
    steps = {}
    for s in cfg.steps:
        raw = cfg.resolved_parameters(s, "cpu")
        raw.update({k: str(v) for k, v in overrides.get(s.key, {}).items()})
        ctx = StepContext(model_name=cfg.model_name(s), params=parse_params(s.cls.Params, raw), device="cpu",
                          base_dir=ROOT, max_batch_size=cfg.max_batch_size)
        steps[s.key] = s.cls(ctx)
    return steps


def run_step(step, tensors: list[dict], request_id: str = "") -> list[dict]:
    names = {t.name for t in step.inputs}
    reqs = [Request({k: v for k, v in t.items() if k in names}, request_id=f"{request_id}{i}")
            for i, t in enumerate(tensors)]
    if not step.decoupled:
        outs = step.execute(reqs)
    else:
        sinks = [Sink() for _ in reqs]
        for r, s in zip(reqs, sinks):
            step.submit(r, s)
        outs = [s.result() for s in sinks]
    for o in outs:
        if isinstance(o, BaseException):
            raise o
    return outs


def run_chain(steps: dict, requests: list[dict], until: str | None = None) -> list[dict]:
    """Every step on the whole batch, in the ensemble's order, outputs wired by name."""
    tensors = [dict(r) for r in requests]
    for key, step in steps.items():
        for t, o in zip(tensors, run_step(step, tensors)):
            t.update(o)
        if key == until:
            break
    return tensors


@pytest.fixture(scope="module")
def models(tiny_checkpoints):
    loaded = {name: load_steps(name) for name in ("wan2_2_ti2v", "wan2_2_t2v_a14b", "wan2_2_i2v_a14b")}
    yield loaded
    for steps in loaded.values():
        for s in steps.values():
            s.close()


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    """(model, image or None, request kwargs, output_type) -> the diffusers pipeline's output."""
    import diffusers
    from diffusers import WanImageToVideoPipeline, WanPipeline

    from triton_omni.diffusion.checkpoint import load_component

    diffusers.utils.logging.set_verbosity_error()
    pipes = {}

    def run(model: str, image: bytes | None, output_type: str, **kw):
        key = (model, image is not None)
        if key not in pipes:
            folder = tiny_checkpoints[model]
            # diffusers loads these transformers only through accelerate: the reference gets ours, from the same files
            extra = {k: load_component(folder, k) for k in ("transformer", "transformer_2")
                     if k == "transformer" or "a14b" in model}
            cls = WanImageToVideoPipeline if image is not None else WanPipeline
            pipes[key] = cls.from_pretrained(str(folder), **extra)
            pipes[key].set_progress_bar_config(disable=True)
        if image is not None:
            kw["image"] = Image.open(io.BytesIO(image)).convert("RGB")
        seed = kw.pop("seed")
        return pipes[key](generator=torch.Generator().manual_seed(seed), output_type=output_type, **kw).frames

    return run


# -- request fields ----------------------------------------------------------------------------
LIMITS = VideoLimits(max_frames=33, max_side=128, max_pixels=128 * 64, default_size="64x32", default_frames=9,
                     default_fps=8, default_steps=4)


def parsed(experts: int = 1, **values):
    return parse_request(Request(fields(prompt="a fox", **values)), 32, 4, LIMITS, experts)


def test_defaults_sizes_frames_and_seconds():
    r = parsed()
    assert (r.width, r.height, r.num_frames, r.fps, r.num_inference_steps) == (64, 32, 9, 8, 4)
    assert parsed(size="128x32").width == 128 and parsed(width=32, height=64).height == 64
    assert parsed(seconds=1.0, fps=8).num_frames == 9          # 8 frames after the first
    assert parsed(seconds=1.4, fps=8).num_frames == 13         # 11.2 frames: the nearest 1 + 4k
    assert parsed(experts=2, guidance_scale=4.0).guidance_scale_2 == 4.0      # the pipelines' default
    assert parsed(experts=2, guidance_scale=4.0, guidance_scale_2=3.0).guidance_scale_2 == 3.0


@pytest.mark.parametrize("values,field,reason", [
    ({"num_frames": 0}, "num_frames", "between 1 and 33"),
    ({"num_frames": 37}, "num_frames", "between 1 and 33"),
    ({"num_frames": 10}, "num_frames", "e.g. 9 or 13"),
    ({"seconds": 60.0}, "seconds", "at most 33"),
    ({"seconds": 1.0, "num_frames": 9}, "seconds", "not both"),
    ({"size": "48x32"}, "size", "multiples of 32"),
    ({"size": "256x32"}, "size", "largest side"),
    ({"size": "wide"}, "size", "WIDTHxHEIGHT"),
    ({"width": 64}, "height", "together"),
    ({"size": "64x32", "width": 32, "height": 32}, "size", "disagrees"),
    ({"fps": -1}, "fps", "between 1 and"),
    ({"fps": 0}, "fps", "between 1 and"),
    ({"num_inference_steps": 0}, "num_inference_steps", "between 1 and"),
    ({"guidance_scale": -1.0}, "guidance_scale", "between 0"),
    ({"guidance_scale_2": 3.0}, "guidance_scale_2", "one denoising transformer"),
    ({"seed": -1}, "seed", "between 0"),
])
def test_bad_fields_are_refused_by_name(values, field, reason):
    with pytest.raises(InvalidInput) as err:
        parsed(**values)
    assert err.value.field == field and reason in str(err.value), str(err.value)


def test_pre_steps_take_or_refuse_the_first_frame(models):
    ti2v, t2v, i2v = (models[m]["pre"] for m in ("wan2_2_ti2v", "wan2_2_t2v_a14b", "wan2_2_i2v_a14b"))
    base = dict(prompt="a fox", width=64, height=32, num_frames=9)
    [out] = run_step(ti2v, [fields(**base, image=png(40, 20))])
    assert out["first_frame"].shape == (32, 64, 3) and out["text_ids"].shape == (2, 512)    # resized; CFG rows
    assert run_step(ti2v, [fields(**base)])[0]["first_frame"].shape == (0, 0, 3)
    cases = [(t2v, fields(**base, image=png(8, 8)), "takes no image"), (i2v, fields(**base), "is required"),
             (ti2v, fields(**base, image=b"not a png"), "not a recognised image"),
             (ti2v, fields(**base, image=png(64, 32)[:60]), "truncated")]
    for step, request, reason in cases:
        [err] = step.execute([Request(request)])
        assert isinstance(err, InvalidInput) and err.field == "image" and reason in str(err), err


# -- media -----------------------------------------------------------------------------------------
def test_mp4_is_h264_yuv420p_at_the_fps_with_every_frame():
    frames = np.zeros((9, 32, 48, 3), np.uint8) + np.linspace(0, 250, 48, dtype=np.uint8)[None, None, :, None]
    video = decode_video(encode_mp4(frames, fps=12))
    assert (video.codec, video.pix_fmt, video.fps) == ("h264", "yuv420p", 12.0)
    assert video.frames.shape == frames.shape and np.abs(video.frames.astype(int) - frames).mean() < 2
    with pytest.raises(ValueError, match="even"):
        encode_mp4(np.zeros((1, 31, 32, 3), np.uint8), fps=8)


# -- the steps against the pipelines ------------------------------------------------------------------
CASES = {   # name: (model, first frame or None, width, height); 4 steps put two on each A14B expert
    "t2v_a14b": ("wan2_2_t2v_a14b", None, 32, 32),
    "ti2v_text": ("wan2_2_ti2v", None, 64, 32),
    "ti2v_image": ("wan2_2_ti2v", png(64, 32, 1), 64, 32),
    "i2v_a14b": ("wan2_2_i2v_a14b", png(48, 40, 2), 64, 32),
}


@pytest.mark.parity
@pytest.mark.parametrize("case", list(CASES))
def test_latents_and_frames_equal_the_diffusers_pipeline(models, reference, case):
    model, image, width, height = CASES[case]
    request = dict(prompt="a red fox in the snow", negative_prompt="blurry", width=width, height=height,
                   num_frames=9, num_inference_steps=4, guidance_scale=5.0, seed=7)
    experts = "a14b" in model
    if experts:
        request["guidance_scale_2"] = 3.0
    steps = models[model]
    calls = {}
    hooks = [m.register_forward_hook(lambda mod, a, o, i=i: calls.__setitem__(i, calls.get(i, 0) + 1))
             for i, m in enumerate(steps["denoise"].transformers())]
    try:
        [out] = run_chain(steps, [fields(**request, **({"image": image} if image else {}))])
    finally:
        for h in hooks:
            h.remove()
    ref_kw = dict(prompt=request["prompt"], negative_prompt="blurry", width=width, height=height, num_frames=9,
                  num_inference_steps=4, guidance_scale=5.0, seed=7, **({"guidance_scale_2": 3.0} if experts else {}))
    want_latents = reference(model, image, "latent", **ref_kw)[0].numpy()
    assert out["latents"].shape == want_latents.shape
    assert np.abs(out["latents"] - want_latents).max() < 1e-4
    want_frames = reference(model, image, "np", **ref_kw)[0]
    assert out["frames"].shape == (9, height, width, 3)
    assert np.abs(out["frames"].astype(np.float64) - want_frames * 255).max() <= 1.0
    # both experts ran, two steps each, conditional and unconditional rows in one call
    assert calls == ({0: 2, 1: 2} if experts else {0: 4})
    assert decode_video(out["video"][0]).frames.shape == (9, height, width, 3)


# -- the denoise loop --------------------------------------------------------------------------------
def denoise_inputs(models, model: str, prompts_seeds: list[tuple[str, int]], steps: int = 4, image=None) -> list[dict]:
    """The denoise step's inputs for these requests (the chain up to the VAE encode)."""
    requests = [fields(prompt=p, width=64, height=32, num_frames=9, num_inference_steps=steps, guidance_scale=5.0,
                       seed=s, **({"image": image} if image else {})) for p, s in prompts_seeds]
    return run_chain(models[model], requests, until="vae_encode")


def submit(step, tensors: dict, request_id: str, on_send=None) -> Sink:
    sink = Sink(on_send)
    names = {t.name for t in step.inputs}
    step.submit(Request({k: v for k, v in tensors.items() if k in names}, request_id=request_id), sink)
    return sink


def test_clips_sent_together_share_calls_and_equal_clips_alone(models):
    step = models["wan2_2_ti2v"]["denoise"]
    inputs = denoise_inputs(models, "wan2_2_ti2v", [("sun", 1), ("moon", 2)], image=png(64, 32, 3))
    alone = [submit(step, x, f"alone{i}").result()["latents"] for i, x in enumerate(inputs)]
    calls = step.loop.stats.model_calls
    step.loop.stats.max_call_clips = 0
    sinks = [submit(step, x, f"together{i}") for i, x in enumerate(inputs)]
    together = [s.result()["latents"] for s in sinks]
    assert step.loop.stats.max_call_clips == 2 and step.loop.stats.model_calls - calls == 4
    for a, t in zip(alone, together):
        assert np.abs(a - t).max() < 1e-5
    assert np.abs(together[0] - together[1]).max() > 1e-2       # each kept its own prompt and noise


def test_a_clip_joins_running_clips_at_their_next_step_and_still_equals_itself_alone(models):
    step = models["wan2_2_ti2v"]["denoise"]
    first, second = denoise_inputs(models, "wan2_2_ti2v", [("a tree", 5), ("a lake", 6)], steps=6)
    second = {**second, "num_inference_steps": np.array([3], np.int32)}
    alone = [submit(step, x, f"solo{i}").result()["latents"] for i, x in enumerate((first, second))]
    calls = step.loop.stats.model_calls
    step.loop.stats.max_call_clips = 0
    joined = {}

    def join_after_two(outputs):
        if outputs.get("progress") is not None and outputs["progress"][0] == 2 and "sink" not in joined:
            joined["sink"] = submit(step, second, "late")

    watch = Sink(on_send=join_after_two)
    step.submit(Request(fields(progress_request_id="early")), watch)        # before its clip arrives
    sink = submit(step, first, "early")
    a = sink.result()["latents"]
    b = joined["sink"].result()["latents"]
    progress = [tuple(r["progress"]) for r in watch.responses]
    assert progress == [(i, 6) for i in range(1, 7)] and watch.done.is_set()
    # the late clip's 3 steps ran in calls the first clip's steps were in: fewer calls than steps
    assert step.loop.stats.max_call_clips == 2 and step.loop.stats.model_calls - calls < 6 + 3
    assert np.abs(a - alone[0]).max() < 1e-5 and np.abs(b - alone[1]).max() < 1e-5


def test_an_aborted_clip_frees_its_slot_for_the_next(models):
    steps = load_steps("wan2_2_ti2v", denoise={"max_clips": 1})
    try:
        step = steps["denoise"]
        long, short = denoise_inputs(models, "wan2_2_ti2v", [("long", 1), ("short", 2)], steps=2)
        long = {**long, "num_inference_steps": np.array([100], np.int32)}
        started = threading.Event()
        watch = Sink(on_send=lambda o: started.set())
        step.submit(Request(fields(progress_request_id="long")), watch)
        slow = submit(step, long, "long")
        quick = submit(step, short, "short")               # waits: one clip at a time
        assert started.wait(30)
        step.submit(Request(fields(abort_request_id="long,nobody")), Sink())
        assert quick.result(60)["latents"].shape == (48, 3, 2, 4)
        with pytest.raises(Cancelled):
            slow.result()
        stats = step.loop.stats
        assert (stats.clips_cancelled, stats.clips_finished, stats.active_clips) == (1, 1, 0)
        assert watch.done.is_set() and len(watch.responses) < 100
    finally:
        for s in steps.values():
            s.close()


def test_clips_past_max_waiting_clips_are_refused_at_once(models):
    steps = load_steps("wan2_2_ti2v", denoise={"max_clips": 1, "max_waiting_clips": 1})
    try:
        step = steps["denoise"]
        long, short = denoise_inputs(models, "wan2_2_ti2v", [("long", 1), ("short", 2)], steps=2)
        long = {**long, "num_inference_steps": np.array([100], np.int32)}
        slow = submit(step, long, "long")
        deadline = time.monotonic() + 30
        while not step.loop.active and time.monotonic() < deadline:
            time.sleep(0.01)
        assert step.loop.active and not step.loop.waiting  # running: the one slot taken
        queued = submit(step, short, "queued")             # the one place in the queue
        with pytest.raises(Unavailable, match="max_waiting_clips = 1"):
            submit(step, short, "refused")
        step.submit(Request(fields(abort_request_id="long")), Sink())
        assert queued.result(60)["latents"].shape == (48, 3, 2, 4)
        with pytest.raises(Cancelled):
            slow.result()
    finally:
        for s in steps.values():
            s.close()


def test_steps_called_directly_refuse_malformed_tensors(models):
    steps = models["wan2_2_ti2v"]
    [good] = denoise_inputs(models, "wan2_2_ti2v", [("x", 1)], image=png(64, 32))
    bad = [({"prompt_embeds": np.zeros((4, 7), np.float32)}, "prompt_embeds", "values a token"),
           ({"condition": np.zeros((48, 1, 2, 3), np.float32)}, "condition", "shape [48, 1, 2, 4]"),
           ({"num_frames": np.array([8], np.int32)}, "num_frames", "1 + a multiple of 4"),
           ({"width": np.array([48], np.int32)}, "width", "multiples of 32")]
    for change, field, reason in bad:
        with pytest.raises(InvalidInput) as err:
            run_step(steps["denoise"], [{**good, **change}])
        assert err.value.field == field and reason in str(err.value), str(err.value)
    [err] = steps["vae_decode"].execute([Request({"latents": np.zeros((16, 3, 2, 4), np.float32)})])
    assert isinstance(err, InvalidInput) and "48 channels" in str(err)
    [err] = steps["encode"].execute([Request({"frames": np.zeros((3, 31, 32, 3), np.uint8),
                                              "fps": np.array([8], np.int32)})])
    assert isinstance(err, InvalidInput) and err.field == "frames"
