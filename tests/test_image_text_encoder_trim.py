"""The image text encoders run their decoder layers only up to the deepest hidden state they read:
the states they return are bit-identical (CPU, float32) to those of transformers' full forward with
output_hidden_states=True. And the `compile` parameter of the text encoder and VAE decode steps
parses, reaches the steps through the ensembles' resolved parameters, and is ignored on CPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from triton_omni.converters.schema import load_ensemble
from triton_omni.diffusion.text_encoder import TextEncoderParams
from triton_omni.image.text_encoder import decoder_hidden_states
from triton_omni.image.vae import VaeDecodeParams
from triton_omni.runtime.params import parse_params
from triton_omni.runtime.step import Request, StepContext

ROOT = Path(__file__).resolve().parent.parent


def build_step(name: str, key: str, checkpoint: Path, **overrides: str):
    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{name}.yaml")
    s = next(s for s in cfg.steps if s.key == key)
    raw = {**cfg.resolved_parameters(s, "cpu"), "checkpoint": str(checkpoint), **overrides}
    ctx = StepContext(model_name=cfg.model_name(s), params=parse_params(s.cls.Params, raw), device="cpu",
                      base_dir=ROOT, max_batch_size=cfg.max_batch_size)
    return s.cls(ctx)


def token_batch(vocab: int, lengths: list[int], width: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[rows, width] int32 ids and mask: each row's real tokens first, then padding."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (len(lengths), width)).astype(np.int32)
    mask = (np.arange(width)[None] < np.array(lengths)[:, None]).astype(np.int32)
    return ids, mask


def layer_calls(model) -> tuple[list[int], list]:
    """Which decoder layers run, recorded by hooks (the caller removes them through the handles)."""
    calls: list[int] = []
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: calls.append(i)) for i, layer in enumerate(model.layers)]
    return calls, handles


@pytest.fixture(scope="module")
def flux2_encoder(tiny_checkpoints):
    return build_step("flux2_klein", "text_encoder", tiny_checkpoints["flux2_klein"])


@pytest.fixture(scope="module")
def z_image_encoder(tiny_checkpoints):
    return build_step("z_image_turbo", "text_encoder", tiny_checkpoints["z_image_turbo"])


@pytest.mark.parametrize("wanted", [[9, 18, 27], [0], [1], [-2], [-1], [28], [27, 28, 3], list(range(29))])
def test_trimmed_states_equal_the_full_forward(flux2_encoder, wanted):
    model = flux2_encoder.base_model                      # tiny: 28 layers, so 29 hidden states
    ids, mask = token_batch(model.config.vocab_size, [5, 17, 32], 32)
    ids_t, mask_t = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
    with torch.inference_mode():
        full = model(input_ids=ids_t, attention_mask=mask_t, output_hidden_states=True, use_cache=False).hidden_states
        calls, handles = layer_calls(model)
        try:
            got = decoder_hidden_states(model, ids_t, mask_t, wanted)
        finally:
            for h in handles:
                h.remove()
    assert len(full) == 29
    for k, g in zip(wanted, got):
        assert torch.equal(g, full[k]), k
    assert calls == list(range(max(k % 29 for k in wanted)))   # the layers past the deepest one do not run


def test_out_of_range_index_is_an_error(flux2_encoder):
    with pytest.raises(ValueError, match="out of range"):
        decoder_hidden_states(flux2_encoder.base_model, torch.zeros(1, 4, dtype=torch.long),
                              torch.ones(1, 4, dtype=torch.long), [29])


def test_flux2_encoder_equals_the_full_model(flux2_encoder):
    """The step's embeddings, as the step computed them before (the whole model, layers 9, 18, 27 stacked)."""
    model = flux2_encoder.base_model
    ids, mask = token_batch(model.config.vocab_size, [40, 512], 512, seed=1)
    with torch.inference_mode():
        got = flux2_encoder.encode(ids, mask)
        out = model(input_ids=torch.from_numpy(ids.astype(np.int64)), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                    output_hidden_states=True, use_cache=False)
    stacked = torch.stack([out.hidden_states[k] for k in (9, 18, 27)], dim=1)
    want = stacked.permute(0, 2, 1, 3).reshape(2, 512, -1)
    assert len(got) == 2 and all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("lengths", [[7], [7, 23], [23, 23]])   # [23, 23]: no padding, so no mask tensor
def test_z_image_encoder_equals_the_full_model(z_image_encoder, lengths):
    """The step's embeddings, as the step computed them before (the whole model's hidden_states[-2])."""
    model = z_image_encoder.text_encoder
    ids, mask = token_batch(model.config.vocab_size, lengths, 64, seed=2)
    keep = max(lengths)
    calls, handles = layer_calls(z_image_encoder.base_model)
    try:
        with torch.inference_mode():
            got = z_image_encoder.encode(ids, mask)
    finally:
        for h in handles:
            h.remove()
    assert calls == list(range(model.config.num_hidden_layers - 1))    # the last layer does not run
    with torch.inference_mode():
        hidden = model(input_ids=torch.from_numpy(ids[:, :keep].astype(np.int64)),
                       attention_mask=torch.from_numpy(mask[:, :keep]).bool(), output_hidden_states=True).hidden_states[-2]
    assert len(got) == len(lengths)
    for r, n in enumerate(lengths):
        assert torch.equal(got[r], hidden[r, :n])


# -- the compile parameter ------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [TextEncoderParams, VaeDecodeParams])
def test_compile_parses_and_defaults_off(cls):
    assert cls().compile is False
    assert parse_params(cls, {"compile": "true"}).compile is True
    assert parse_params(cls, {"compile": "false"}).compile is False


@pytest.mark.parametrize("name", ["flux2_klein", "z_image_turbo"])
def test_resolved_parameters_carry_compile(name):
    """The image benchmark's ours-compile mode sets compile=true on every step whose resolved parameters have it."""
    cfg = load_ensemble(ROOT / "ensemble_configs" / f"{name}.yaml")
    for target in ("cpu", "gpu"):
        params = {s.key: cfg.resolved_parameters(s, target) for s in cfg.steps}
        for key in ("text_encoder", "denoise", "vae_decode"):
            assert params[key]["compile"] == "false", (target, key)


def test_compile_is_ignored_on_cpu(tiny_checkpoints):
    folder = tiny_checkpoints["flux2_klein"]
    encoder = build_step("flux2_klein", "text_encoder", folder, compile="true")
    vae = build_step("flux2_klein", "vae_decode", folder, compile="true")
    assert encoder.params.compile and vae.params.compile
    # Still the plain layers and bound method: nothing was handed to torch.compile.
    assert all(a is b for a, b in zip(encoder.layers, encoder.base_model.layers, strict=True))
    assert vae.decode.__func__ is type(vae).decode
    ids, mask = token_batch(encoder.base_model.config.vocab_size, [9], 512)
    latents = np.random.default_rng(0).standard_normal((1, 32, 4, 4)).astype(np.float32)
    [enc] = encoder.execute([Request({"text_ids": ids, "text_mask": mask})])
    [dec] = vae.execute([Request({"latents": latents})])
    assert enc["prompt_embeds"].shape[0] == 512 and dec["pixels"].dtype == np.uint8
