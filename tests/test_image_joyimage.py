"""JoyAI-Image-Edit (`joyai_image_edit`, route image_edit): our steps in-process against diffusers'
JoyImageEditPipeline on the same tiny random weights, then the ensemble on a live tritonserver.

The pipeline's output sizes are a fixed table of ~1024x1024 buckets; every test here serves the same
table scaled to base 256 (our `base_size` parameter; the parity test scales the pipeline's table the
same way) to stay quick on a CPU. The pipeline samples the VAE posterior of the input image from torch's
global generator, which nothing can seed; we take its mode, and the parity test has the reference do
the same.
"""
from __future__ import annotations

import functools
import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tritonclient.utils import InferenceServerException

from triton_omni.converters.schema import load_ensemble
from triton_omni.diffusion.checkpoint import load_component
from triton_omni.image.edit import processor_from_parts
from triton_omni.image.joyimage.steps import nearest_bucket, release_buckets
from triton_omni.media.image import encode_image
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import parse_params
from triton_omni.runtime.step import Request, StepContext
from tests.conftest import ROOT, TINY, rounds_until_batched, running_server
from tests.test_image_edit import FIELD_TYPES, png_size
from tests.test_image_edit import edit as edit_model
from tests.test_image_server import generate_together
from tests.test_image_steps import request as text_to_image_request, run_chain

MODEL = "joyai_image_edit"
BASE = 256                      # the bucket table's base size in these tests (the release's is 1024)


def picture(width: int, height: int, seed: int = 0) -> bytes:
    """A PNG with structure (a gradient plus noise), so the VAE and the vision tower see an image."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1)
    return encode_image(np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8))


def pil(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def bucket(width: int, height: int) -> tuple[int, int]:
    """(width, height) of the base-256 bucket nearest width x height's aspect."""
    h, w = nearest_bucket(height, width, [(h * BASE // 1024, w * BASE // 1024) for h, w in release_buckets()])
    return w, h


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    from triton_omni.converters.tiny import build

    return build(TINY, [MODEL])[MODEL]


@pytest.fixture(scope="module")
def steps(checkpoint) -> list:
    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{MODEL}.yaml")
    out = []
    for s in cfg.steps:
        raw = cfg.resolved_parameters(s, "cpu")
        fields = s.cls.Params.__dataclass_fields__
        raw.update({k: str(v) for k, v in {"checkpoint": checkpoint, "base_size": BASE}.items() if k in fields})
        ctx = StepContext(model_name=cfg.model_name(s), params=parse_params(s.cls.Params, raw), device="cpu",
                          base_dir=ROOT, max_batch_size=cfg.max_batch_size)
        out.append(s.cls(ctx))
    return out


def request(prompt: str, images: list[bytes], **fields) -> dict:
    return {**text_to_image_request(prompt, **fields), "image": np.array(images, dtype=object)}


# -- in-process: parity with diffusers -----------------------------------------------------------------
@pytest.mark.parity
def test_edit_equals_joyimage_edit_pipeline(checkpoint, steps, monkeypatch):
    """With CFG (a negative prompt of another length than the prompt: separate model calls, as the
    transformer has no text mask) and n=2, output size from the input image's aspect."""
    import diffusers
    from diffusers import JoyImageEditPipeline
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
    from diffusers.pipelines.joyimage import image_processor

    diffusers.utils.logging.set_verbosity_error()
    monkeypatch.setattr(image_processor, "BUCKETS", {1024: [(h * BASE // 1024, w * BASE // 1024)
                                                            for h, w in release_buckets()]})
    monkeypatch.setattr(DiagonalGaussianDistribution, "sample", lambda self, generator=None: self.mode())
    source = picture(90, 60, seed=1)
    [got] = run_chain(steps, [request("make the sky red", [source], num_inference_steps=2, guidance_scale=4.0,
                                      negative_prompt="blurry, low quality", seed=7, n=2)])
    # diffusers loads this transformer only through accelerate; the reference gets ours, loaded from the same files.
    pipe = JoyImageEditPipeline.from_pretrained(str(checkpoint),
                                                processor=processor_from_parts(checkpoint, "Qwen3VLProcessor"),
                                                transformer=load_component(checkpoint, "transformer"))
    pipe.set_progress_bar_config(disable=True)
    seen = {}

    def keep(p, i, t, d):
        seen["latents"] = d["latents"]
        return d

    images = pipe(image=pil(source), prompt="make the sky red", negative_prompt="blurry, low quality",
                  guidance_scale=4.0, num_inference_steps=2, num_images_per_prompt=2,
                  generator=torch.Generator().manual_seed(7), output_type="np", callback_on_step_end=keep).images
    latents = seen["latents"][:, -1, :, 0].numpy()                  # the target item, one frame
    pixels = (images * 255).round().astype(int)
    latent_diff = np.abs(got["latents"] - latents).max()
    pixel_diff = np.abs(got["pixels"].astype(int) - pixels).max()
    print(f"JoyImage-Edit parity (fp32): latents max |diff| {latent_diff:.2e}, pixels max |diff| {pixel_diff} levels")
    w, h = bucket(90, 60)
    assert got["pixels"].shape == (2, h, w, 3)
    assert latent_diff < 1e-4 and pixel_diff <= 1
    assert pixels.std() > 10, "the tiny model's image should not be flat"
    assert not np.array_equal(got["pixels"][0], got["pixels"][1]), "the n images come from different noise"


def test_transformer_loads_without_accelerate_keeping_fp32_modules(checkpoint):
    """diffusers loads JoyImageEditTransformer3DModel only through accelerate; our loader reads the
    same safetensors into the same class and keeps the modules it names in float32."""
    from safetensors.torch import load_file

    stored = load_file(str(checkpoint / "transformer" / "diffusion_pytorch_model.safetensors"))
    model = load_component(checkpoint, "transformer", "bfloat16")
    params = dict(model.named_parameters())
    assert set(params) == set(stored)
    for name, p in params.items():
        kept = any(k in name for k in model._keep_in_fp32_modules)
        assert p.dtype == (torch.float32 if kept else torch.bfloat16), name
        assert torch.equal(p.float(), stored[name].to(p.dtype).float()), name


def test_a_request_gets_the_same_latents_alone_or_batched(steps):
    mine = request("a lighthouse at dusk", [picture(70, 50)], size="64x48", num_inference_steps=1,
                   guidance_scale=3.0, negative_prompt="fog", seed=3)
    alone = run_chain(steps, [mine])[0]["latents"]
    crowd = [request("x", [picture(70, 50, seed=1)], size="64x48", num_inference_steps=1, guidance_scale=1.0, seed=9),
             request("a much longer prompt than the others", [picture(40, 60)], size="64x48", num_inference_steps=1,
                     guidance_scale=5.0, seed=8, n=2),
             mine, request("z", [picture(30, 30)], size="48x64", num_inference_steps=1, seed=1)]
    batched = run_chain(steps, crowd)[2]["latents"]
    assert np.abs(alone - batched).max() < 1e-5


BAD = [
    ("no image", [], {}, "field 'image'", "required"),
    ("bad size", [picture(32, 32)], {"size": "wide"}, "field 'size'", "WIDTHxHEIGHT"),
    ("broken bytes", [b"definitely not a png"], {}, "field 'image'", "not a recognised image"),
    ("two images", [picture(32, 32), picture(32, 32)], {}, "field 'image'", "at most 1"),
    ("size 0", [picture(32, 32)], {"size": "0x64"}, "field 'size'", "positive"),
    ("vision token in prompt", [picture(32, 32)], {"prompt": "a <|image_pad|>"}, "field 'prompt'", "vision tokens"),
]


@pytest.mark.parametrize("case,images,fields,field,reason", BAD, ids=[b[0] for b in BAD])
def test_pre_refuses_bad_requests(steps, case, images, fields, field, reason):
    prompt = fields.pop("prompt", "ok")
    with pytest.raises(InvalidInput) as err:
        steps[0].one(Request(request(prompt, images, **fields)))
    assert str(err.value).startswith(field) and reason in str(err.value), str(err.value)


# -- live server -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory, checkpoint):
    with running_server(tmp_path_factory.mktemp("joyimage"), [MODEL], [f"{MODEL}.pre.base_size={BASE}"]) as s:
        yield s


edit = functools.partial(edit_model, model=MODEL)


@pytest.mark.server
def test_served_edit_is_a_png_of_the_bucket_size_and_deterministic(server):
    fields = dict(prompt="make it red", image=[picture(90, 60)], num_inference_steps=1, seed=5)
    a = edit(server, **fields)
    assert len(a) == 1 and png_size(a[0]) == bucket(90, 60)        # no size: the input's aspect
    assert edit(server, **fields) == a                             # same seed: same bytes
    assert edit(server, **{**fields, "seed": 6}) != a
    [tall] = edit(server, **{**fields, "size": "48x96"})           # a size picks the bucket of its aspect
    assert png_size(tall) == bucket(48, 96)


@pytest.mark.server
def test_concurrent_edits_share_the_denoise_step(server):
    """Two edits of the same bucket with prompts of different lengths arrive together: Triton batches
    them through the denoise step; each image equals the one its request gets alone."""
    requests = [dict(prompt="sun", image=[picture(64, 64, seed=1)], num_inference_steps=1, guidance_scale=1.0,
                     seed=1),
                dict(prompt="a much longer prompt about the moon", image=[picture(60, 60, seed=2)],
                     num_inference_steps=1, guidance_scale=1.0, seed=2)]
    alone = [edit(server, **r) for r in requests]
    rounds = rounds_until_batched(server, f"{MODEL}_denoise",
                                  lambda: generate_together(server, MODEL, requests, FIELD_TYPES))
    assert rounds[-1][1:] == (2, 1), f"denoise ran (requests, executions) {rounds[-1][1:]}"
    for together, _, _ in rounds:
        for a, t in zip(alone, together):
            assert np.abs(np.asarray(pil(a[0])).astype(int) - np.asarray(pil(t[0])).astype(int)).max() <= 1


SERVED_BAD = [
    ("no image", {"image": None}, "image", "required"),
    ("broken image bytes", {"image": [b"\x89PNG\r\n\x1a\n broken"]}, "image", "image 1 of 1"),
    ("steps 0", {"num_inference_steps": 0}, "num_inference_steps", "between 1 and"),
]


@pytest.mark.server
@pytest.mark.parametrize("case,fields,field,reason", SERVED_BAD, ids=[b[0] for b in SERVED_BAD])
def test_bad_input_fails_that_request_only(server, case, fields, field, reason):
    good = dict(prompt="ok", image=[picture(48, 48)], num_inference_steps=1, guidance_scale=1.0, seed=3)
    with ThreadPoolExecutor(2) as pool:
        neighbour = pool.submit(edit, server, **good)
        with pytest.raises(InferenceServerException) as err:
            edit(server, **{**good, **fields})
        images = neighbour.result(timeout=120)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT", err.value
    assert f"field '{field}'" in err.value.message() and reason in err.value.message(), err.value.message()
    assert png_size(images[0]) == bucket(48, 48)                  # the neighbour was not harmed
