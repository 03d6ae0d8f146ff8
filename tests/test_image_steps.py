"""The image steps in-process (no server): request checks, media, and the chained steps against the
diffusers pipelines at the latent level, where the tolerance can be tight."""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from triton_omni.converters.schema import load_ensemble
from triton_omni.image.request import ImageLimits, parse_size
from triton_omni.media.image import ImageDecodeError, decode_pixels, encode_image
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import parse_params
from triton_omni.runtime.step import Request, StepContext

ROOT = Path(__file__).resolve().parent.parent


# -- request fields ----------------------------------------------------------------------------
@pytest.mark.parametrize("text,want", [("1024x768", (1024, 768)), ("50x70", (48, 64)), (" 32 X 16 ", (32, 16)),
                                       ("auto", (1024, 1024)), ("16×16", (16, 16))])
def test_size_parses_and_snaps_down(text, want):
    assert parse_size(text, 16, ImageLimits()) == want


@pytest.mark.parametrize("text,reason", [("0x64", "positive"), ("100000x100000", "exceeds"),
                                         ("4096x4096", "pixels"), ("abc", "WIDTHxHEIGHT"), ("-5x5", "WIDTHxHEIGHT"),
                                         ("8x64", "smallest size 16x16"), ("", "WIDTHxHEIGHT")])
def test_bad_sizes_name_the_field(text, reason):
    with pytest.raises(InvalidInput) as err:
        parse_size(text, 16, ImageLimits(max_pixels=2048 * 2048))
    assert str(err.value).startswith("field 'size': ") and reason in str(err.value)


# -- media ---------------------------------------------------------------------------------------
def test_png_round_trip_is_exact_and_lossy_formats_decode():
    px = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    assert np.array_equal(decode_pixels(encode_image(px)), px)
    for fmt, pil in (("jpeg", "JPEG"), ("webp", "WEBP")):
        data = encode_image(px, fmt, quality=90)
        assert Image.open(io.BytesIO(data)).format == pil and decode_pixels(data).shape == (20, 30, 3)


def test_decode_rejects_broken_truncated_and_oversized_images():
    png = encode_image(np.zeros((64, 64, 3), np.uint8) + 7)
    for data, reason in ((b"", "empty"), (b"not an image at all", "not a recognised image"),
                         (png[: len(png) // 2], "truncated")):
        with pytest.raises(ImageDecodeError, match=reason):
            decode_pixels(data)
    with pytest.raises(ImageDecodeError, match="at most 100 pixels"):
        decode_pixels(png, max_pixels=100)


def test_transparent_pixels_decode_onto_white():
    buf = io.BytesIO()
    Image.new("RGBA", (2, 2), (255, 0, 0, 0)).save(buf, format="PNG")
    assert decode_pixels(buf.getvalue()).tolist() == [[[255, 255, 255]] * 2] * 2


# -- the steps, chained as the ensemble chains them ------------------------------------------------
def load_steps(name: str, checkpoint: Path | None = None) -> list:
    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{name}.yaml")
    steps = []
    for s in cfg.steps:
        raw = cfg.resolved_parameters(s, "cpu")
        if checkpoint is not None and "checkpoint" in raw:
            raw["checkpoint"] = str(checkpoint)
        ctx = StepContext(model_name=cfg.model_name(s), params=parse_params(s.cls.Params, raw), device="cpu",
                          base_dir=ROOT, max_batch_size=cfg.max_batch_size)
        steps.append(s.cls(ctx))
    return steps


def request(prompt: str, **fields) -> dict:
    types = {"size": object, "negative_prompt": object, "output_format": object, "guidance_scale": np.float32,
             "seed": np.int64, "num_inference_steps": np.int32, "n": np.int32}
    out = {"prompt": np.array([prompt.encode()], dtype=object)}
    for k, v in fields.items():
        out[k] = np.array([v.encode() if isinstance(v, str) else v], dtype=types[k])
    return out


def run_chain(steps: list, requests: list[dict]) -> list[dict]:
    """Every step's execute on the whole batch, outputs wired by name (latest producer wins)."""
    tensors = [dict(r) for r in requests]
    for step in steps:
        names = {t.name for t in step.inputs}
        outs = step.execute([Request({k: v for k, v in t.items() if k in names}) for t in tensors])
        for t, o in zip(tensors, outs):
            if isinstance(o, BaseException):
                raise o
            t.update(o)
    return tensors


@pytest.fixture(scope="module")
def pipelines(tiny_checkpoints):
    import diffusers
    from diffusers import Flux2KleinPipeline, ZImagePipeline

    diffusers.utils.logging.set_verbosity_error()
    out = {"z_image_turbo": ZImagePipeline.from_pretrained(str(tiny_checkpoints["z_image_turbo"])),
           "flux2_klein": Flux2KleinPipeline.from_pretrained(str(tiny_checkpoints["flux2_klein"]))}
    for p in out.values():
        p.set_progress_bar_config(disable=True)
    return out


def reference_latents(pipe, model: str, prompt: str, width: int, height: int, steps: int, guidance: float, seed: int,
                      n: int = 1) -> torch.Tensor:
    """The pipeline's final latents, in the layout the denoise step outputs."""
    kw = dict(prompt=prompt, width=width, height=height, num_inference_steps=steps, guidance_scale=guidance,
              num_images_per_prompt=n, generator=torch.Generator().manual_seed(seed))
    if model == "z_image_turbo":
        return pipe(output_type="latent", **kw).images
    # Flux2 returns latents already mapped to the VAE; its transformer-space latents are the ones
    # the last callback sees (packed [B, h*w, C]).
    seen = {}

    def keep(p, i, t, d):
        seen["latents"] = d["latents"]
        return d

    pipe(output_type="latent", callback_on_step_end=keep, **kw)
    b, hw, c = seen["latents"].shape
    return seen["latents"].reshape(b, height // 16, width // 16, c).permute(0, 3, 1, 2)


@pytest.mark.parametrize("model,guidance", [("z_image_turbo", 0.0), ("z_image_turbo", 2.5),
                                            ("flux2_klein", 1.0), ("flux2_klein", 4.0)])
def test_latents_and_pixels_equal_the_pipeline(pipelines, model, guidance):
    """With the models' real text length (512) and a batch that also holds other sizes."""
    steps = load_steps(model)
    batch = run_chain(steps, [request("a red cat", size="48x64", num_inference_steps=3, guidance_scale=guidance,
                                      seed=7, n=2),
                              request("other", size="32x32", num_inference_steps=2, guidance_scale=guidance, seed=1)])
    want = reference_latents(pipelines[model], model, "a red cat", 48, 64, 3, guidance, 7, n=2)
    assert batch[0]["latents"].shape == tuple(want.shape)
    assert np.abs(batch[0]["latents"] - want.numpy()).max() < 1e-4
    pixels = pipelines[model](prompt="a red cat", width=48, height=64, num_inference_steps=3, guidance_scale=guidance,
                              num_images_per_prompt=2, generator=torch.Generator().manual_seed(7),
                              output_type="np").images
    assert np.abs(batch[0]["pixels"].astype(int) - (pixels * 255).round().astype(int)).max() <= 1


@pytest.mark.parametrize("model", ["z_image_turbo", "flux2_klein"])
def test_a_request_gets_the_same_latents_alone_or_batched(model):
    steps = load_steps(model)
    mine = request("a lighthouse", size="32x48", num_inference_steps=2, guidance_scale=4.0, seed=3)
    alone = run_chain(steps, [mine])[0]["latents"]
    crowd = [request("x", size="32x48", num_inference_steps=2, guidance_scale=0.0, seed=9),
             request("y", size="64x32", num_inference_steps=2, guidance_scale=4.0, seed=8, n=2),
             mine, request("z", size="32x48", num_inference_steps=3, seed=1)]
    batched = run_chain(steps, crowd)[2]["latents"]
    assert np.abs(alone - batched).max() < 1e-5


def test_guidance_switches_the_negative_branch_per_model(tmp_path, tiny_checkpoints):
    def rows(steps, guidance):
        return run_chain(steps[:1], [request("p", size="32x32", guidance_scale=guidance)])[0]["text_ids"].shape[0]

    z, flux = load_steps("z_image_turbo")[:1], load_steps("flux2_klein")[:1]
    assert (rows(z, 0.0), rows(z, 0.5)) == (1, 2)              # Z-Image: CFG for any scale above 0
    assert (rows(flux, 1.0), rows(flux, 1.5)) == (1, 2)        # FLUX.2 base: CFG above 1
    distilled = tmp_path / "klein_distilled"
    shutil.copytree(tiny_checkpoints["flux2_klein"], distilled)
    index = json.loads((distilled / "model_index.json").read_text())
    (distilled / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    assert rows(load_steps("flux2_klein", checkpoint=distilled)[:1], 4.0) == 1   # distilled: never


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model_index.json"):
        load_steps("z_image_turbo", checkpoint=tmp_path)


def test_attention_parameter_is_checked_where_the_step_loads():
    """`attention` picks diffusers' attention backend: the YAMLs give GPUs cuDNN, CPUs torch's own;
    an unknown name, or cuDNN on a CPU, fails at load naming the parameter."""
    cfg = load_ensemble(ROOT / "ensemble_configs" / "z_image_turbo.yaml")
    denoise = next(s for s in cfg.steps if s.key == "denoise")
    assert (cfg.resolved_parameters(denoise, "gpu")["attention"], cfg.resolved_parameters(denoise, "cpu")["attention"]) \
        == ("cudnn", "native")
    for value, reason in (("flash3", "expected one of"), ("cudnn", "needs a CUDA device")):
        raw = dict(cfg.resolved_parameters(denoise, "cpu"), attention=value)
        ctx = StepContext(model_name="z", params=parse_params(denoise.cls.Params, raw), device="cpu", base_dir=ROOT,
                          max_batch_size=cfg.max_batch_size)
        with pytest.raises(ValueError, match=f"parameter attention: .*{reason}"):
            denoise.cls(ctx)
