"""Bad input to every image model and to its internal steps, on one live tritonserver.

Any step can be called directly by a client, not only through its ensemble: each must answer a
malformed or oversized tensor with INVALID_ARG naming it, quickly (the guard or the step's own checks,
before any work), and keep serving. And a model called without `prompt` must say so, not "unexpected
deadlock" (Triton's ensemble scheduler leaves the step that needs a missing input unrun).
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from triton_omni.client.tensors import make_inputs
from triton_omni.media.image import decode_pixels, encode_image
from tests.conftest import running_server

pytestmark = pytest.mark.server

TEXT_TO_IMAGE = ["z_image_turbo", "flux2_klein", "bagel"]
EDIT = ["qwen_image_edit", "joyai_image_edit"]
MODELS = TEXT_TO_IMAGE + EDIT
HUGE = 1 << 20          # entries along one dimension: a 4 MB tensor that asked for gigabytes before
QUICK_S = 10.0          # a refusal comes before any work


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    # JoyImage's buckets scaled to base 256, as its own tests serve it: quicker on a CPU
    with running_server(tmp_path_factory.mktemp("bad_image"), MODELS, ["joyai_image_edit.pre.base_size=256"]) as s:
        yield s


def picture(width: int = 48, height: int = 48) -> bytes:
    y, x = np.mgrid[0:height, 0:width]
    return encode_image(np.stack([x * 5 % 256, y * 5 % 256, (x + y) % 256], axis=-1).astype(np.uint8))


def infer(server, model: str, values: dict) -> dict:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, make_inputs(grpcclient, values), client_timeout=120)
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
    finally:
        client.close()


def refused(server, model: str, values: dict, field: str, reason: str = "") -> str:
    """Send `values` to `model`: it must answer INVALID_ARG naming `field` (and saying `reason`), quickly."""
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        infer(server, model, values)
    elapsed = time.monotonic() - start
    message = err.value.message()
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT", message
    assert f"field '{field}'" in message and reason in message, message
    assert elapsed < QUICK_S, f"{model} took {elapsed:.1f} s to refuse"
    return message


def request(model: str, **fields) -> dict:
    values = {"size": ("32x32", "BYTES"), "num_inference_steps": (1, "INT32"), "seed": (1, "INT64")}
    if model in EDIT:
        values["image"] = ([picture()], "BYTES")
    values.update({k: (v, "BYTES" if isinstance(v, (str, list)) else "FP32") for k, v in fields.items()})
    return values


def test_no_prompt_names_prompt(server):
    for model in MODELS:
        message = refused(server, model, request(model), "prompt", "missing")
        assert "deadlock" not in message


def test_non_finite_guidance_is_refused(server):
    for value in (float("nan"), float("inf")):
        refused(server, "z_image_turbo", request("z_image_turbo", prompt="a cat", guidance_scale=value),
                "guidance_scale")


def f32(*shape) -> tuple:
    return np.zeros(shape, np.float32), "FP32"


def i32(*shape, value: int = 1) -> tuple:
    return np.full(shape, value, np.int32), "INT32"


# (VAE decode step, its latents' channels): shapes one request may send and one it may not
VAE_DECODE = {"z_image_turbo_vae_decode": 16, "flux2_klein_vae_decode": 32, "qwen_image_edit_vae_decode": 16,
              "joyai_image_edit_vae_decode": 16, "bagel_vae_decode": 16}


@pytest.mark.parametrize("model", sorted(VAE_DECODE))
def test_vae_decode_refuses_oversized_and_malformed_latents(server, model):
    channels = VAE_DECODE[model]
    refused(server, model, {"latents": f32(HUGE, 1, 1, 1)}, "latents", "at most 4")          # images
    refused(server, model, {"latents": f32(1, channels, HUGE // 64, 1)}, "latents")          # a side
    refused(server, model, {"latents": f32(1, channels + 1, 2, 2)}, "latents", "channels")
    refused(server, model, {"latents": f32(1, channels, 0, 2)}, "latents", "empty")
    [pixels] = infer(server, model, {"latents": f32(1, channels, 2, 2)})["pixels"]          # a good one
    assert pixels.shape[-1] == 3 and pixels.shape[1] >= 2


TEXT_ENCODERS = ["z_image_turbo_text_encoder", "flux2_klein_text_encoder"]
EDIT_TEXT_ENCODERS = ["qwen_image_edit_text_encoder", "joyai_image_edit_text_encoder"]


@pytest.mark.parametrize("model", TEXT_ENCODERS + EDIT_TEXT_ENCODERS)
def test_text_encoder_refuses_oversized_and_malformed_ids(server, model):
    vision = {"pixel_values": f32(4, 1176 if model.startswith("qwen") else 1536),
              "image_grid_thw": (np.array([[1, 2, 2]], np.int64), "INT64")} if model in EDIT_TEXT_ENCODERS else {}
    refused(server, model, {"text_ids": i32(1, HUGE), "text_mask": i32(1, HUGE), **vision}, "text_ids",
            "at most")
    refused(server, model, {"text_ids": i32(3, 8), "text_mask": i32(3, 8), **vision}, "text_ids", "at most 2")
    refused(server, model, {"text_ids": i32(1, 8, value=10**6), "text_mask": i32(1, 8), **vision}, "text_ids",
            "vocabulary")
    refused(server, model, {"text_ids": i32(1, 8), "text_mask": i32(1, 7), **vision}, "text_mask")


def test_edit_text_encoder_refuses_inconsistent_images(server):
    model = "qwen_image_edit_text_encoder"
    ids = {"text_ids": i32(1, 8), "text_mask": i32(1, 8)}
    grid = (np.array([[1, 2, 2]], np.int64), "INT64")
    refused(server, model, {**ids, "pixel_values": f32(5, 1176), "image_grid_thw": grid}, "pixel_values")
    refused(server, model, {**ids, "pixel_values": f32(4, 1176), "image_grid_thw": grid}, "text_ids",
            "image tokens")          # no <|image_pad|> in the ids for the image's merged patches


def settings(width: int = 32, height: int = 32, steps: int = 1, guidance: float = 0.0, n: int = 1) -> dict:
    return {"width": i32(1, value=width), "height": i32(1, value=height), "num_inference_steps": i32(1, value=steps),
            "guidance_scale": (np.array([guidance], np.float32), "FP32"),
            "seed": (np.array([1], np.int64), "INT64"), "n": i32(1, value=n)}


def test_denoise_refuses_bad_settings_and_embeddings(server):
    model, dim = "z_image_turbo_denoise", 32          # the tiny Z-Image's caption width
    text = {"prompt_embeds": f32(4, dim), "negative_embeds": f32(0, dim)}
    refused(server, model, {**text, **settings(guidance=float("nan"))}, "guidance_scale", "finite")
    refused(server, model, {**text, **settings(width=10**6)}, "width")
    refused(server, model, {**text, **settings(width=24)}, "width", "multiple of 16")
    refused(server, model, {**text, **settings(steps=10**6)}, "num_inference_steps")
    refused(server, model, {**text, **settings(n=10**6)}, "n")
    refused(server, model, {"prompt_embeds": f32(HUGE, dim), "negative_embeds": f32(0, dim), **settings()},
            "prompt_embeds", "at most 512")
    refused(server, model, {"prompt_embeds": f32(4, dim + 1), "negative_embeds": f32(0, dim), **settings()},
            "prompt_embeds", "values a token")
    [latents] = infer(server, model, {**text, **settings()})["latents"]
    assert latents.shape == (1, 16, 4, 4)


def test_vae_encode_refuses_mismatched_pixels(server):
    model = "qwen_image_edit_vae_encode"
    sizes = (np.array([[32, 32]], np.int32), "INT32")
    refused(server, model, {"condition_pixels": (np.zeros(100, np.uint8), "UINT8"), "condition_sizes": sizes},
            "condition_pixels")
    refused(server, model, {"condition_pixels": (np.zeros(HUGE * 40, np.uint8), "UINT8"), "condition_sizes": sizes},
            "condition_pixels", "at most")
    refused(server, model, {"condition_pixels": (np.zeros(30 * 30 * 3, np.uint8), "UINT8"),
                            "condition_sizes": (np.array([[30, 30]], np.int32), "INT32")}, "condition_sizes")


def test_broken_and_oversized_images_to_the_edit_models(server):
    for model in EDIT:
        refused(server, model, request(model, prompt="x", image=[b"\x89PNG\r\n\x1a\n broken"]), "image",
                "image 1 of 1")


def test_encode_refuses_oversized_pixels(server):
    refused(server, "z_image_turbo_encode", {"pixels": (np.zeros((1, HUGE, 1, 3), np.uint8), "UINT8")}, "pixels")
    refused(server, "z_image_turbo_encode", {"pixels": (np.zeros((1, 0, 4, 3), np.uint8), "UINT8")}, "pixels")


def test_good_requests_still_complete(server):
    for model in MODELS:
        [png] = infer(server, model, request(model, prompt="still serving"))["images"].reshape(-1)
        height, width, _ = decode_pixels(png).shape
        assert (width, height) == (32, 32) or model == "joyai_image_edit"     # JoyImage: its bucket's size
