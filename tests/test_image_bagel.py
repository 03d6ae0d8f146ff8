"""BAGEL text to image (`bagel`, route image_generation): our model and steps in-process against installable
references and against a golden output of the release's own code, then the ensemble on a live tritonserver.

The release (github ByteDance-Seed/Bagel) is source only, so CI cannot run it: tests/data/bagel_golden.npz
is its output on the tiny checkpoint (converters/tiny_bagel.py), written by tests/ref/bagel_golden.py. The
pieces it is built from are checked here against packages: the understanding expert against transformers'
Qwen2 (without q/k norms) and Qwen3 (with them, Qwen2's biases), the schedule against diffusers' shift.
"""
from __future__ import annotations

import functools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from tritonclient.utils import InferenceServerException

from triton_omni.image.bagel.model import BagelConfig, BagelGenerator, schedule, unpatchify
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request
from tests.conftest import ROOT, TINY, rounds_until_batched, running_server
from tests.test_image_server import generate, generate_together, pixels
from tests.test_image_steps import load_steps, request, run_chain

MODEL = "bagel"
GOLDEN = ROOT / "tests" / "data" / "bagel_golden.npz"


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    from triton_omni.converters.tiny import build

    return build(TINY, [MODEL])[MODEL]


@pytest.fixture(scope="module")
def steps(checkpoint) -> list:
    return load_steps(MODEL, checkpoint)


# -- parity ------------------------------------------------------------------------------------------------
@pytest.mark.parity
def test_latents_and_pixels_equal_the_release_golden(steps):
    """The release's InterleaveInferencer (float32, CPU) on the tiny checkpoint: one request with CFG over 6
    steps (the last outside cfg_interval), one without CFG."""
    golden = np.load(GOLDEN)
    for name, prompt, (h, w), calls, scale, seed in json.loads(str(golden["cases"])):
        [got] = run_chain(steps, [request(prompt, size=f"{w}x{h}", num_inference_steps=calls, guidance_scale=scale,
                                          seed=seed)])
        latent_diff = np.abs(got["latents"][0] - golden[f"{name}_latents"]).max()
        # The release truncates to uint8 where we round: ours is the same or one level higher.
        levels = got["pixels"][0].astype(int) - golden[f"{name}_pixels"].astype(int)
        print(f"BAGEL vs release golden ({name}, fp32): latents max |diff| {latent_diff:.2e}, "
              f"pixels {levels.min()}..{levels.max()} levels")
        assert got["pixels"].shape == (1, h, w, 3)
        assert latent_diff < 1e-4 and 0 <= levels.min() and levels.max() <= 1
        assert golden[f"{name}_pixels"].std() > 10, "the tiny model's image should not be flat"


def _ours_from_transformers(hf, qk_norm: bool) -> BagelGenerator:
    """Our generator whose understanding expert holds a transformers model's weights."""
    c = hf.config
    config = BagelConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads,
                         num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                         rope_theta=c.rope_parameters["rope_theta"], qk_norm=qk_norm, latent_channels=16, patch=2,
                         max_latent_size=4)
    ours = BagelGenerator(config, c.vocab_size)
    state = {"embed_tokens.weight": hf.embed_tokens.weight}
    for i, layer in enumerate(hf.layers):
        a = layer.self_attn
        for p in "qkv":
            state[f"layers.{i}.und.{p}.weight"] = getattr(a, f"{p}_proj").weight
            state[f"layers.{i}.und.{p}.bias"] = getattr(a, f"{p}_proj").bias
        state[f"layers.{i}.und.o.weight"] = a.o_proj.weight
        if qk_norm:
            state[f"layers.{i}.und.q_norm.weight"] = a.q_norm.weight
            state[f"layers.{i}.und.k_norm.weight"] = a.k_norm.weight
        for p in ("gate_proj", "up_proj", "down_proj"):
            state[f"layers.{i}.mlp.{p}.weight"] = getattr(layer.mlp, p).weight
        state[f"layers.{i}.norm_in.weight"] = layer.input_layernorm.weight
        state[f"layers.{i}.norm_post.weight"] = layer.post_attention_layernorm.weight
    ours.load_state_dict(state, strict=False)
    return ours.eval()


@pytest.mark.parity
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_text_prefill_equals_transformers(family):
    """The understanding expert on text only is Qwen2 (q/k/v biases); BAGEL adds q/k norms, which is Qwen3's
    attention with biases (attention_bias=True also biases o_proj: zeroed). The prefill's per-layer rotated
    keys and values equal the transformers cache at every real token of right-padded prompts."""
    from transformers import Qwen2Config, Qwen2Model, Qwen3Config, Qwen3Model

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(0)
    hf = Qwen2Model(Qwen2Config(**common)) if family == "qwen2" else Qwen3Model(Qwen3Config(**common,
                                                                                           attention_bias=True))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(torch.zeros_like(p) if name.endswith("o_proj.bias") else
                    (1 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.2 * torch.randn_like(p)))
    hf.eval()
    ours = _ours_from_transformers(hf, qk_norm=family == "qwen3")
    ids = torch.randint(0, 128, (2, 9))
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    with torch.no_grad():
        cache = hf(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values
        mine = ours.prefill(ids, mask)
    worst = 0.0
    for i, (k, v) in enumerate(mine):
        ref_k, ref_v = cache.layers[i].keys, cache.layers[i].values
        for row, length in enumerate(mask.sum(1).tolist()):
            worst = max(worst, (k[row, :, :length] - ref_k[row, :, :length]).abs().max().item(),
                        (v[row, :, :length] - ref_v[row, :, :length]).abs().max().item())
    print(f"BAGEL prefill vs transformers {family}: max |diff| {worst:.2e}")
    assert worst < 1e-5


def test_schedule_is_the_flow_match_shift():
    """linspace(1, 0, N + 1) through s t / (1 + (s - 1) t): diffusers' static flow-match shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    t = schedule(6, 3.0)
    assert t[0] == 1 and t[-1] == 0 and len(t) == 7
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(sigmas=torch.linspace(1, 0, 7)[:-1].numpy())
    assert torch.allclose(t[:-1], sched.sigmas[:-1].float(), atol=1e-6)
    assert [x > 0.4 for x in t[:-1].tolist()] == [True] * 5 + [False]     # the golden's CFG-off last step


def test_unpatchify_is_the_inverse_of_the_release_patch_layout():
    """Tokens hold each 2x2 patch row, column, channel (the release's 'hwpqc')."""
    latents = torch.randn(2, 16, 6, 4)
    tokens = latents.reshape(2, 16, 3, 2, 2, 2).permute(0, 2, 4, 3, 5, 1).reshape(2, 6, 64)
    assert torch.equal(unpatchify(tokens, 3, 2, 2, 16), latents)


# -- batching and requests ---------------------------------------------------------------------------------
def test_a_request_gets_the_same_latents_alone_or_batched(steps):
    """Prompts of other lengths (padded KV caches), rows with and without CFG, n=2 and another size."""
    mine = request("a lighthouse at dusk", size="32x32", num_inference_steps=3, guidance_scale=4.0, seed=3)
    alone = run_chain(steps, [mine])[0]["latents"]
    crowd = [request("x", size="32x32", num_inference_steps=3, guidance_scale=1.0, seed=9),
             request("a much longer prompt than the other ones here", size="32x32", num_inference_steps=3,
                     guidance_scale=6.0, seed=8, n=2),
             mine, request("z", size="48x32", num_inference_steps=3, seed=1)]
    out = run_chain(steps, crowd)
    assert np.abs(alone - out[2]["latents"]).max() < 1e-5
    assert not np.array_equal(out[1]["latents"][0], out[1]["latents"][1]), "n images come from different noise"


BAD = [
    ("size 0", {"size": "0x64"}, "field 'size'", "positive"),
    ("size 100000 px", {"size": "100000x32"}, "field 'size'", "exceeds"),
    ("size past the position table", {"size": "512x256"}, "field 'size'", "(256 px)"),
    ("size below 16", {"size": "8x8"}, "field 'size'", "snap"),
    ("steps 0", {"num_inference_steps": 0}, "field 'num_inference_steps'", "between 1 and"),
    ("n 0", {"n": 0}, "field 'n'", "between 1 and"),
    ("negative prompt", {"negative_prompt": "blurry"}, "field 'negative_prompt'", "no negative prompt"),
    ("special token", {"prompt": "a <|vision_start|> cat"}, "field 'prompt'", "special tokens"),
    ("gif", {"output_format": "gif"}, "field 'output_format'", "png, jpeg, webp"),
]


@pytest.mark.parametrize("case,fields,field,reason", BAD, ids=[b[0] for b in BAD])
def test_pre_refuses_bad_requests(steps, case, fields, field, reason):
    fields = dict(fields)
    with pytest.raises(InvalidInput) as err:
        steps[0].one(Request(request(fields.pop("prompt", "ok"), **fields)))
    assert str(err.value).startswith(field) and reason in str(err.value), str(err.value)


def test_sizes_snap_down_to_16_and_the_default_fits_the_checkpoint(steps):
    out = steps[0].one(Request(request("ok", size="50x70")))
    assert (int(out["width"][0]), int(out["height"][0])) == (48, 64)
    # The release's 1024x1024 default shrinks to the tiny checkpoint's 16 x 16 patch table (256 px).
    out = steps[0].one(Request(request("ok")))
    assert (int(out["width"][0]), int(out["height"][0])) == (256, 256)


# -- live server -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory, checkpoint):
    with running_server(tmp_path_factory.mktemp("bagel"), [MODEL]) as s:
        yield s


bagel = functools.partial(generate, model=MODEL)


@pytest.mark.server
def test_served_png_size_and_determinism(server):
    fields = dict(prompt="a red cat on a hill", size="32x48", num_inference_steps=2, guidance_scale=4.0)
    a = bagel(server, seed=5, **fields)
    assert len(a) == 1 and pixels(a[0]).shape == (48, 32, 3)      # "WxH": 32 wide, 48 high
    assert bagel(server, seed=5, **fields) == a                   # same seed: same bytes
    assert bagel(server, seed=6, **fields) != a
    two = bagel(server, seed=5, n=2, output_format="jpeg", **fields)
    assert len(two) == 2 and pixels(two[0], "JPEG").shape == (48, 32, 3)


@pytest.mark.server
def test_concurrent_requests_share_one_denoise_execution(server):
    """Two same-size requests (prompts of different lengths, one with CFG) arrive together: one denoise
    execute runs both; each image equals the one its request gets alone."""
    requests = [dict(prompt="sun", seed=1, size="32x32", num_inference_steps=2, guidance_scale=4.0),
                dict(prompt="a much longer prompt about the moon", seed=2, size="32x32", num_inference_steps=2,
                     guidance_scale=1.0)]
    alone = [bagel(server, **r) for r in requests]
    rounds = rounds_until_batched(server, f"{MODEL}_denoise", lambda: generate_together(server, MODEL, requests))
    assert rounds[-1][1:] == (2, 1), f"denoise ran (requests, executions) {rounds[-1][1:]}"
    for together, _, _ in rounds:
        for a, t in zip(alone, together):
            assert np.abs(pixels(a[0]).astype(int) - pixels(t[0]).astype(int)).max() <= 1


SERVED_BAD = [
    ("size 0", {"size": "0x64"}, "size", "positive"),
    ("size 100000 px", {"size": "100000x100000"}, "size", "exceeds"),
    ("steps 0", {"num_inference_steps": 0}, "num_inference_steps", "between 1 and"),
    ("negative prompt", {"negative_prompt": "fog"}, "negative_prompt", "no negative prompt"),
]


@pytest.mark.server
@pytest.mark.parametrize("case,fields,field,reason", SERVED_BAD, ids=[b[0] for b in SERVED_BAD])
def test_bad_input_fails_that_request_only(server, case, fields, field, reason):
    good = dict(prompt="ok", size="32x32", num_inference_steps=1, seed=3)
    with ThreadPoolExecutor(2) as pool:
        neighbour = pool.submit(bagel, server, **good)
        with pytest.raises(InferenceServerException) as err:
            bagel(server, **{**good, **fields})
        images = neighbour.result(timeout=120)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT", err.value
    assert f"field '{field}'" in err.value.message() and reason in err.value.message(), err.value.message()
    assert pixels(images[0]).shape == (32, 32, 3)                 # the neighbour was not harmed
