"""Qwen-Image-Edit (`qwen_image_edit`, route image_edit): our steps in-process against diffusers'
QwenImageEditPipeline / QwenImageEditPlusPipeline on the same tiny random weights, then the ensemble
on a live tritonserver, directly and through the OpenAI proxy with the `openai` SDK.

The Edit pipeline resizes every input image to about 1024x1024 pixels (hard-coded), so its parity
test runs at that size; the other tests lower the ensemble's `image_area` to stay quick on a CPU.
"""
from __future__ import annotations

import base64
import io
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
import torch
import tritonclient.grpc as grpcclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from triton_omni.client.image import ImageClient
from triton_omni.client.tensors import make_inputs
from triton_omni.converters.schema import load_ensemble
from triton_omni.image.edit import processor_from_parts
from triton_omni.image.qwen_image.steps import calculate_dimensions, unpack
from triton_omni.media.image import encode_image
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import parse_params
from triton_omni.runtime.step import Request, StepContext
from tests.conftest import ROOT, TINY, rounds_until_batched, running_server
from tests.test_image_server import generate_together
from tests.test_image_steps import request as text_to_image_request, run_chain
from tests.test_openai_proxy import running_proxy

MODEL = "qwen_image_edit"
SMALL_AREA = 128 * 128          # image_area for everything but the Edit parity test
FIELD_TYPES = {"prompt": "BYTES", "negative_prompt": "BYTES", "size": "BYTES", "num_inference_steps": "INT32",
               "guidance_scale": "FP32", "seed": "INT64", "n": "INT32", "output_format": "BYTES", "image": "BYTES"}


def picture(width: int, height: int, seed: int = 0) -> bytes:
    """A PNG with structure (a gradient plus noise), so the VAE and the vision tower see an image."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1)
    return encode_image(np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8))


def pil(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    from triton_omni.converters.tiny import build

    return build(TINY, [MODEL])[MODEL]


def load_steps(checkpoint: Path, **overrides) -> list:
    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{MODEL}.yaml")
    steps = []
    for s in cfg.steps:
        raw = cfg.resolved_parameters(s, "cpu")
        fields = s.cls.Params.__dataclass_fields__
        raw.update({k: str(v) for k, v in {"checkpoint": checkpoint, **overrides}.items() if k in fields})
        ctx = StepContext(model_name=cfg.model_name(s), params=parse_params(s.cls.Params, raw), device="cpu",
                          base_dir=ROOT, max_batch_size=cfg.max_batch_size)
        steps.append(s.cls(ctx))
    return steps


def request(prompt: str, images: list[bytes], **fields) -> dict:
    return {**text_to_image_request(prompt, **fields), "image": np.array(images, dtype=object)}


def reference(pipe, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    """The pipeline's final latents ([n, C, h, w], as our denoise step outputs them) and pixels."""
    seen = {}

    def keep(p, i, t, d):
        seen["latents"] = d["latents"]
        return d

    images = pipe(output_type="np", callback_on_step_end=keep, **kwargs).images
    h, w = kwargs["height"] // 8, kwargs["width"] // 8
    return unpack(seen["latents"], h, w).numpy(), (images * 255).round().astype(int)


# -- in-process: parity with diffusers -----------------------------------------------------------------
@pytest.mark.parity
def test_edit_equals_qwen_image_edit_pipeline(checkpoint):
    """At the pipeline's own 1024x1024 image area, with true CFG (a negative prompt of another length
    than the prompt: our batch pads and masks it, the pipeline runs it alone) and n=2."""
    import diffusers
    from diffusers import QwenImageEditPipeline

    diffusers.utils.logging.set_verbosity_error()
    source = picture(90, 60, seed=1)
    [got] = run_chain(load_steps(checkpoint), [
        request("make the sky red", [source], size="48x64", num_inference_steps=2, guidance_scale=4.0,
                negative_prompt="blurry, low quality", seed=7, n=2)])
    pipe = QwenImageEditPipeline.from_pretrained(str(checkpoint), processor=processor_from_parts(checkpoint))
    pipe.set_progress_bar_config(disable=True)
    latents, pixels = reference(pipe, image=pil(source), prompt="make the sky red",
                                negative_prompt="blurry, low quality", true_cfg_scale=4.0, width=48, height=64,
                                num_inference_steps=2, num_images_per_prompt=2,
                                generator=torch.Generator().manual_seed(7))
    latent_diff = np.abs(got["latents"] - latents).max()
    pixel_diff = np.abs(got["pixels"].astype(int) - pixels).max()
    print(f"Edit parity (fp32): latents max |diff| {latent_diff:.2e}, pixels max |diff| {pixel_diff} levels")
    assert got["pixels"].shape == (2, 64, 48, 3)
    assert latent_diff < 1e-4 and pixel_diff <= 1
    assert pixels.std() > 10, "the tiny model's image should not be flat"
    assert not np.array_equal(got["pixels"][0], got["pixels"][1]), "the n images come from different noise"


@pytest.mark.parity
def test_edit_plus_equals_qwen_image_edit_plus_pipeline(checkpoint, tmp_path, monkeypatch):
    """A checkpoint whose model_index.json names QwenImageEditPlusPipeline: two input images of
    different shapes, "Picture i:" slots, a smaller VL copy of each image, no CFG. The Plus pipeline
    keeps its VAE image area in a module constant, so both sides run at SMALL_AREA."""
    import diffusers
    from diffusers import QwenImageEditPlusPipeline
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus

    diffusers.utils.logging.set_verbosity_error()
    plus = tmp_path / "qwen_image_edit_plus"
    shutil.copytree(checkpoint, plus)
    index = json.loads((plus / "model_index.json").read_text())
    (plus / "model_index.json").write_text(json.dumps({**index, "_class_name": "QwenImageEditPlusPipeline"}))
    monkeypatch.setattr(pipeline_qwenimage_edit_plus, "VAE_IMAGE_SIZE", SMALL_AREA)
    sources = [picture(90, 60, seed=3), picture(50, 80, seed=4)]
    [got] = run_chain(load_steps(plus, image_area=SMALL_AREA),
                      [request("put the first in the second", sources, size="64x48", num_inference_steps=3,
                               guidance_scale=1.0, seed=5)])
    pipe = QwenImageEditPlusPipeline.from_pretrained(str(plus), processor=processor_from_parts(plus))
    pipe.set_progress_bar_config(disable=True)
    latents, pixels = reference(pipe, image=[pil(s) for s in sources], prompt="put the first in the second",
                                true_cfg_scale=1.0, width=64, height=48, num_inference_steps=3,
                                generator=torch.Generator().manual_seed(5))
    latent_diff = np.abs(got["latents"] - latents).max()
    pixel_diff = np.abs(got["pixels"].astype(int) - pixels).max()
    print(f"EditPlus parity (fp32): latents max |diff| {latent_diff:.2e}, pixels max |diff| {pixel_diff} levels")
    assert latent_diff < 1e-4 and pixel_diff <= 1


def test_a_request_gets_the_same_latents_alone_or_batched(checkpoint):
    steps = load_steps(checkpoint, image_area=SMALL_AREA)
    mine = request("a lighthouse at dusk", [picture(70, 50)], size="32x48", num_inference_steps=2,
                   guidance_scale=3.0, negative_prompt="fog", seed=3)
    alone = run_chain(steps, [mine])[0]["latents"]
    crowd = [request("x", [picture(70, 50, seed=1)], size="32x48", num_inference_steps=2, guidance_scale=1.0, seed=9),
             request("a much longer prompt than the others", [picture(40, 60)], size="32x48", num_inference_steps=2,
                     guidance_scale=5.0, seed=8, n=2),
             mine, request("z", [picture(30, 30)], size="48x32", num_inference_steps=2, seed=1)]
    batched = run_chain(steps, crowd)[2]["latents"]
    assert np.abs(alone - batched).max() < 1e-5


def test_prompt_and_image_both_change_the_edit(checkpoint):
    steps = load_steps(checkpoint, image_area=SMALL_AREA)
    common = dict(size="32x32", num_inference_steps=2, guidance_scale=1.0, seed=4)
    a, b, c = (run_chain(steps, [r])[0]["pixels"] for r in (
        request("make it red", [picture(64, 64, seed=1)], **common),
        request("make it blue", [picture(64, 64, seed=1)], **common),
        request("make it red", [picture(64, 64, seed=2)], **common)))
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


# -- in-process: request checks ------------------------------------------------------------------------
def test_default_size_follows_the_input_image(checkpoint):
    pre = load_steps(checkpoint)[0]
    for w, h in ((90, 60), (60, 90), (500, 500), (1000, 563)):
        out = pre.one(Request(request("p", [picture(w, h)], num_inference_steps=1)))
        cw, ch = calculate_dimensions(1024 * 1024, w / h)
        assert (int(out["width"][0]), int(out["height"][0])) == (cw // 16 * 16, ch // 16 * 16)
        assert tuple(out["condition_sizes"][0]) == (ch, cw)     # the VAE's copy: ~1024x1024, multiples of 32


BAD = [
    ("no image", [], {}, "field 'image'", "at least one"),
    ("broken bytes", [b"definitely not a png"], {}, "field 'image'", "not a recognised image"),
    ("truncated png", [picture(64, 64)[:200]], {}, "field 'image'", "image 1 of 1"),
    ("too many images", [picture(32, 32), picture(32, 32)], {}, "field 'image'", "at most 1"),
    ("too narrow", [picture(4000, 1)], {}, "field 'image'", "too narrow"),
    ("default size too wide", [picture(1500, 10)], {}, "field 'size'", "exceeds the largest side"),
    ("size 0", [picture(32, 32)], {"size": "0x64"}, "field 'size'", "positive"),
    ("vision token in prompt", [picture(32, 32)], {"prompt": "a <|image_pad|>"}, "field 'prompt'", "vision tokens"),
]


@pytest.mark.parametrize("case,images,fields,field,reason", BAD, ids=[b[0] for b in BAD])
def test_pre_refuses_bad_requests(checkpoint, case, images, fields, field, reason):
    pre = load_steps(checkpoint)[0]
    prompt = fields.pop("prompt", "ok")
    with pytest.raises(InvalidInput) as err:
        pre.one(Request(request(prompt, images, **fields)))
    assert str(err.value).startswith(field) and reason in str(err.value), str(err.value)


# -- live server -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory, checkpoint):
    with running_server(tmp_path_factory.mktemp("image_edit"), [MODEL], [f"{MODEL}.pre.image_area={SMALL_AREA}"]) as s:
        yield s


def edit(server, model: str = MODEL, **fields) -> list[bytes]:
    """One edit request to `model` over gRPC: its encoded images (shared by the other edit models' tests)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, make_inputs(grpcclient, {k: (v, FIELD_TYPES[k]) for k, v in fields.items()}),
                              client_timeout=120)
        return list(result.as_numpy("images").reshape(-1))
    finally:
        client.close()


def png_size(data: bytes) -> tuple[int, int]:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    image.load()
    return image.size


@pytest.mark.server
def test_served_edit_is_a_png_of_the_expected_size_and_deterministic(server):
    source = picture(90, 60)
    fields = dict(prompt="make it red", image=[source], num_inference_steps=2, seed=5)
    a = edit(server, **fields)
    w, h = calculate_dimensions(SMALL_AREA, 90 / 60)
    assert len(a) == 1 and png_size(a[0]) == (w // 16 * 16, h // 16 * 16)     # no size: the input's aspect
    assert edit(server, **fields) == a                                       # same seed: same bytes
    assert edit(server, **{**fields, "seed": 6}) != a
    [sized] = edit(server, **{**fields, "size": "48x64"})
    assert png_size(sized) == (48, 64)


@pytest.mark.server
def test_concurrent_edits_share_the_model_steps(server):
    """Two edits of the same output size with prompts of different lengths and different input images
    arrive together: Triton batches them (ragged inputs) through the text encoder, VAE encode and
    denoise steps; each image equals the one its request gets alone."""
    requests = [dict(prompt="sun", image=[picture(64, 64, seed=1)], size="32x32", num_inference_steps=2, seed=1),
                dict(prompt="a much longer prompt about the moon", image=[picture(80, 48, seed=2)], size="32x32",
                     num_inference_steps=2, seed=2)]
    alone = [edit(server, **r) for r in requests]
    rounds = rounds_until_batched(server, f"{MODEL}_denoise",      # back to back, one connection
                                  lambda: generate_together(server, MODEL, requests, FIELD_TYPES))
    assert rounds[-1][1:] == (2, 1), f"denoise ran (requests, executions) {rounds[-1][1:]}"
    for together, _, _ in rounds:
        for a, t in zip(alone, together):
            assert np.abs(np.asarray(pil(a[0])).astype(int) - np.asarray(pil(t[0])).astype(int)).max() <= 1


SERVED_BAD = [
    ("no image", {"image": None}, "at least one"),
    ("broken image bytes", {"image": [b"\x89PNG\r\n\x1a\n broken"]}, "image 1 of 1"),
    ("too many images", {"image": [picture(32, 32), picture(40, 40)]}, "at most 1"),
    ("size 0", {"size": "0x64"}, "positive"),
]


@pytest.mark.server
@pytest.mark.parametrize("case,fields,reason", SERVED_BAD, ids=[b[0] for b in SERVED_BAD])
def test_bad_input_fails_that_request_only(server, case, fields, reason):
    good = dict(prompt="ok", image=[picture(48, 48)], size="32x32", num_inference_steps=2, guidance_scale=1.0, seed=3)
    with ThreadPoolExecutor(2) as pool:
        neighbour = pool.submit(edit, server, **good)
        with pytest.raises(InferenceServerException) as err:
            edit(server, **{**good, **fields})
        images = neighbour.result(timeout=120)
    field = "size" if case == "size 0" else "image"
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT", err.value
    assert f"field '{field}'" in err.value.message() and reason in err.value.message(), err.value.message()
    assert png_size(images[0]) == (32, 32)                   # the neighbour was not harmed


@pytest.mark.server
def test_openai_sdk_edit_equals_the_direct_call(server, tmp_path):
    with running_proxy(server.grpc_url, tmp_path / "proxy.log") as url:
        sdk = openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=120)
        source = picture(64, 48, seed=9)
        extra = {"seed": 11, "num_inference_steps": 2}
        result = sdk.images.edit(model=MODEL, image=("in.png", source, "image/png"), prompt="add a hat",
                                 size="64x48", extra_body=extra)
        images = [base64.b64decode(d.b64_json) for d in result.data]
        direct = ImageClient(server.grpc_url).edit(MODEL, [source], "add a hat", size="64x48", **extra)
        assert images == direct and png_size(images[0]) == (64, 48)
        with pytest.raises(openai.BadRequestError) as err:
            sdk.images.edit(model=MODEL, image=("bad.png", b"not an image", "image/png"), prompt="x")
        assert "image" in str(err.value)
        sdk.close()
