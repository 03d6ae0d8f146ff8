"""The image ensembles (Z-Image-Turbo, FLUX.2-klein) on a live tritonserver.

Expected pixels come from the diffusers pipelines themselves (`output_type="np"`, rounded as they
round for PIL) on the same tiny random checkpoints, prompts and seeds, so the served path is
checked end to end against the reference, not only for self-consistency.
"""
from __future__ import annotations

import functools
import io
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from triton_omni.client.tensors import make_inputs
from triton_omni.media.image import encode_image
from tests.conftest import rounds_until_batched, running_server

pytestmark = pytest.mark.server

MODELS = ["z_image_turbo", "flux2_klein"]
FLUX_TEXT_LEN = 64          # a shorter text context than the real 512 keeps the test quick
GUIDED = {"z_image_turbo": 3.0, "flux2_klein": 4.0}   # CFG on (Z-Image: > 0; FLUX.2 base: > 1)
FIELD_TYPES = {"prompt": "BYTES", "negative_prompt": "BYTES", "size": "BYTES", "num_inference_steps": "INT32",
               "guidance_scale": "FP32", "seed": "INT64", "n": "INT32", "output_format": "BYTES"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("image"), MODELS,
                        [f"flux2_klein.max_sequence_length={FLUX_TEXT_LEN}"]) as s:
        yield s


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    """(model, prompt, width, height, steps, guidance, seed, n, negative) -> [n, H, W, 3] uint8."""
    import diffusers
    from diffusers import Flux2KleinPipeline, ZImagePipeline

    diffusers.utils.logging.set_verbosity_error()
    pipes = {}

    def run(model, prompt, width, height, steps, guidance, seed, n=1, negative=None):
        if model not in pipes:
            cls = ZImagePipeline if model == "z_image_turbo" else Flux2KleinPipeline
            pipes[model] = cls.from_pretrained(str(tiny_checkpoints[model]))
            pipes[model].set_progress_bar_config(disable=True)
        kwargs = dict(prompt=prompt, width=width, height=height, num_inference_steps=steps, guidance_scale=guidance,
                      num_images_per_prompt=n, generator=torch.Generator().manual_seed(seed), output_type="np")
        if model == "z_image_turbo":
            kwargs["negative_prompt"] = negative
        else:
            kwargs["max_sequence_length"] = FLUX_TEXT_LEN
        images = pipes[model](**kwargs).images
        return (images * 255).round().astype(np.uint8)

    return run


def generate(server, model: str, **fields) -> list[bytes]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, make_inputs(grpcclient, {k: (v, FIELD_TYPES[k]) for k, v in fields.items()}),
                              client_timeout=120)
        return list(result.as_numpy("images").reshape(-1))
    finally:
        client.close()


def generate_together(server, model: str, requests: list[dict], types: dict | None = None) -> list[list[bytes]]:
    """Send requests back to back (asynchronously, one connection) and wait for all of them."""
    types = types or FIELD_TYPES
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: dict = {}
    done = threading.Semaphore(0)

    def callback(i, result, error):
        results[i] = error if error is not None else result
        done.release()

    try:
        inputs = [make_inputs(grpcclient, {k: (v, types[k]) for k, v in r.items()}) for r in requests]
        for i, inp in enumerate(inputs):
            client.async_infer(model, inp, callback=functools.partial(callback, i), client_timeout=120)
        for _ in requests:
            assert done.acquire(timeout=120), "no answer"
    finally:
        client.close()
    for i in range(len(requests)):
        if isinstance(results[i], Exception):
            raise results[i]
    return [list(results[i].as_numpy("images").reshape(-1)) for i in range(len(requests))]


def pixels(data: bytes, fmt: str = "PNG") -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    assert image.format == fmt
    return np.asarray(image.convert("RGB"))


@pytest.mark.parametrize("guided", [False, True], ids=["no-cfg", "cfg"])
@pytest.mark.parametrize("model", MODELS)
def test_png_equals_the_diffusers_pipeline(server, reference, model, guided):
    guidance = GUIDED[model] if guided else 0.0
    [png] = generate(server, model, prompt="a red cat on a hill", size="48x64", num_inference_steps=3,
                     guidance_scale=guidance, seed=7)
    got = pixels(png)
    assert got.shape == (64, 48, 3)           # "WxH": 48 wide, 64 high
    want = reference(model, "a red cat on a hill", 48, 64, 3, guidance, 7)[0]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


@pytest.mark.parametrize("model", MODELS)
def test_n_images_negative_prompt_and_jpeg(server, reference, model):
    images = generate(server, model, prompt="two boats", negative_prompt="fog", size="32x32", num_inference_steps=2,
                      guidance_scale=GUIDED[model], seed=11, n=2, output_format="jpeg")
    assert len(images) == 2
    got = np.stack([pixels(b, "JPEG") for b in images])
    assert got.shape == (2, 32, 32, 3)
    if model == "z_image_turbo":        # FLUX.2-klein's pipeline has no negative prompt to compare with
        want = reference(model, "two boats", 32, 32, 2, GUIDED[model], 11, n=2, negative="fog")
        # JPEG is lossy: compare with the reference pixels put through the same encoder.
        want = np.stack([pixels(encode_image(w, "jpeg"), "JPEG") for w in want])
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 3
    assert not np.array_equal(got[0], got[1]), "the n images come from different noise"


def test_webp_and_size_snapping(server):
    [webp] = generate(server, "z_image_turbo", prompt="a tree", size="50x70", num_inference_steps=2, seed=1,
                      output_format="webp")
    assert pixels(webp, "WEBP").shape == (64, 48, 3)      # snapped down to multiples of 16


def test_fixed_seed_is_deterministic(server):
    fields = dict(prompt="a lighthouse", size="32x48", num_inference_steps=2, guidance_scale=3.0)
    a = generate(server, "z_image_turbo", seed=5, **fields)
    b = generate(server, "z_image_turbo", seed=5, **fields)
    c = generate(server, "z_image_turbo", seed=6, **fields)
    assert a == b and a != c
    other_prompt = generate(server, "z_image_turbo", seed=5, **{**fields, "prompt": "a submarine"})
    assert other_prompt != a


@pytest.mark.parametrize("model", MODELS)
def test_concurrent_requests_share_one_denoise_execution(server, model):
    """Two requests of the same size arrive together: Triton's dynamic batcher hands them to the
    denoise step in one execute, which runs them (each with its own seed) as one batch."""
    requests = [dict(prompt=p, seed=s, size="32x32", num_inference_steps=2, guidance_scale=GUIDED[model])
                for p, s in (("sun", 1), ("moon", 2))]
    alone = [generate(server, model, **r) for r in requests]
    rounds = rounds_until_batched(server, f"{model}_denoise", lambda: generate_together(server, model, requests))
    assert rounds[-1][1:] == (2, 1), f"denoise ran (requests, executions) {rounds[-1][1:]}"
    for together, _, _ in rounds:
        for a, t in zip(alone, together):
            assert np.abs(pixels(a[0]).astype(int) - pixels(t[0]).astype(int)).max() <= 1


def test_mixed_sizes_and_models_in_flight(server):
    """Requests of several sizes at once: each size is its own group in the denoise step; every
    image equals the one the same request gets alone (tolerance: batched float sums)."""
    cases = [("z_image_turbo", "32x32", 1), ("z_image_turbo", "48x32", 2), ("z_image_turbo", "32x32", 3),
             ("flux2_klein", "32x48", 4), ("flux2_klein", "32x32", 5)]
    run = lambda c: generate(server, c[0], prompt="mixed", size=c[1], num_inference_steps=2, seed=c[2])  # noqa: E731
    alone = [pixels(run(c)[0]) for c in cases]
    with ThreadPoolExecutor(len(cases)) as pool:
        together = [pixels(r[0]) for r in pool.map(run, cases)]
    for a, t in zip(alone, together):
        assert a.shape == t.shape and np.abs(a.astype(int) - t.astype(int)).max() <= 1


BAD = [
    ("size 0", {"size": "0x64"}, "field 'size'", "positive"),
    ("size huge", {"size": "100000x100000"}, "field 'size'", "exceeds"),
    ("size 100000 px wide", {"size": "100000x16"}, "field 'size'", "exceeds"),
    ("size not numeric", {"size": "widexhigh"}, "field 'size'", "WIDTHxHEIGHT"),
    ("size below the multiple", {"size": "8x8"}, "field 'size'", "snap"),
    ("steps 0", {"num_inference_steps": 0}, "field 'num_inference_steps'", "between 1 and"),
    ("steps too many", {"num_inference_steps": 10000}, "field 'num_inference_steps'", "between 1 and"),
    ("n 0", {"n": 0}, "field 'n'", "between 1 and"),
    ("n too many", {"n": 64}, "field 'n'", "between 1 and"),
    ("unknown output_format", {"output_format": "gif"}, "field 'output_format'", "png, jpeg, webp"),
    ("negative guidance", {"guidance_scale": -1.0}, "field 'guidance_scale'", "between 0"),
    ("negative seed", {"seed": -3}, "field 'seed'", "between 0"),
    ("empty prompt", {"prompt": "  "}, "field 'prompt'", "empty"),
]


@pytest.mark.parametrize("case,fields,field,reason", BAD, ids=[b[0] for b in BAD])
def test_bad_input_fails_that_request_only(server, case, fields, field, reason):
    good = dict(prompt="ok", size="32x32", num_inference_steps=2, seed=3)
    with ThreadPoolExecutor(2) as pool:
        neighbour = pool.submit(generate, server, "z_image_turbo", **good)
        with pytest.raises(InferenceServerException) as err:
            generate(server, "z_image_turbo", **{**good, **fields})
        images = neighbour.result(timeout=60)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT", err.value
    assert field in err.value.message() and reason in err.value.message(), err.value.message()
    assert pixels(images[0]).shape == (32, 32, 3)           # the neighbour was not harmed


def test_errors_over_http_and_the_server_keeps_serving(server):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer("flux2_klein", make_inputs(httpclient, {"prompt": ("x", "BYTES"), "size": ("0x0", "BYTES")}))
        assert err.value.status() == "400" and "field 'size'" in err.value.message()
    finally:
        client.close()
    for model in MODELS:
        [png] = generate(server, model, prompt="still here", size="32x32", num_inference_steps=1, seed=1)
        assert pixels(png).shape == (32, 32, 3)
