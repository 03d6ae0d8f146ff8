"""Our SNAC decoder (python_backends/tts/orpheus/snac.py) against the `snac` package, and the properties
streaming relies on: windows with the computed context equal the whole decode, bit for bit.

The reference's NoiseBlock draws `torch.randn` on every decode. Parity is checked both ways: with
`noise: false` in the config (no NoiseBlock at all) and with noise, seeding torch before each side
and letting ours draw through `RandnNoise`, which calls torch.randn in the same order and shapes.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from triton_omni.converters.tiny_tts import SNAC_TINY_CONFIG, snac_24khz
from triton_omni.tts.orpheus.snac import PositionalNoise, RandnNoise, load_snac, positional_normal

snac = pytest.importorskip("snac")

STRIDES = SNAC_TINY_CONFIG["vq_strides"]


def random_codes(frames: int, batch: int = 2, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 4096, (batch, frames * 4 // s), generator=g) for s in STRIDES]


def window(codes, start: int, end: int) -> list[torch.Tensor]:
    return [c[:, start * 4 // s:end * 4 // s] for c, s in zip(codes, STRIDES)]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    folder = tiny_checkpoints["snac_24khz"]
    return folder, load_snac(folder)


@pytest.mark.parity
def test_release_layout_loads_in_the_reference_and_ours(tiny):
    folder, ours = tiny
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert any(k.endswith(".weight_g") for k in state) and not any("parametrizations" in k for k in state)
    assert json.loads((folder / "config.json").read_text())["decoder_rates"] == [8, 8, 4, 2]
    ref = snac.SNAC.from_pretrained(str(folder)).eval()     # the reference's own loader reads it too
    codes = random_codes(12)
    torch.manual_seed(5)
    want = ref.decode(codes)
    torch.manual_seed(5)
    got = ours.decode(codes, RandnNoise())
    assert got.shape == want.shape == (2, 1, 12 * 2048)
    assert want.abs().max() > 0.05                          # audible, not all zeros
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parity
def test_without_noise_equals_reference(tmp_path):
    config = {**SNAC_TINY_CONFIG, "noise": False, "depthwise": False, "decoder_dim": 32}
    snac_24khz(tmp_path, config, seed=3)
    ref = snac.SNAC.from_pretrained(str(tmp_path)).eval()
    ours = load_snac(tmp_path)
    codes = random_codes(9, seed=1)
    torch.testing.assert_close(ours.decode(codes), ref.decode(codes), atol=2e-5, rtol=1e-4)


def test_receptive_field_is_exact(tiny):
    """A window with the computed context reproduces the whole decode (up to float rounding: the
    convolutions may sum in another order for another length); one frame less context or
    lookahead visibly does not."""
    _, ours = tiny
    left, right = ours.context_frames()
    assert (left, right) == (3, 3)          # 10 latent steps each way for the 24 kHz layout
    codes, seeds, fs = random_codes(24, seed=2), torch.tensor([7, 8]), ours.frame_samples
    full = ours.decode(codes, PositionalNoise(seeds, torch.zeros(2)))
    s, e = 8, 14

    def chunk(ws, we):
        out = ours.decode(window(codes, ws, we), PositionalNoise(seeds, torch.full((2,), ws * 4)))
        return out[..., (s - ws) * fs:(e - ws) * fs]

    want = full[..., s * fs:e * fs]
    assert (chunk(s - left, e + right) - want).abs().max() < 1e-6
    assert (chunk(s - left + 1, e + right) - want).abs().max() > 1e-5
    assert (chunk(s - left, e + right - 1) - want).abs().max() > 1e-5


def test_positional_noise_is_gaussian_and_position_keyed():
    pos = torch.arange(200_000)[None]
    n = positional_normal(torch.tensor([3]), 0, pos)[0]
    assert abs(n.mean()) < 0.01 and abs(n.std() - 1) < 0.01
    assert abs((n[:-1] * n[1:]).mean()) < 0.01              # neighbours uncorrelated
    assert torch.equal(positional_normal(torch.tensor([3]), 0, pos[:, 500:900])[0], n[500:900])
    assert not torch.equal(positional_normal(torch.tensor([4]), 0, pos[:, :100]), n[None, :100])
    assert not torch.equal(positional_normal(torch.tensor([3]), 1, pos[:, :100]), n[None, :100])


def test_fixed_batch_decodes_each_row_independently(tiny):
    """At a fixed batch size a row's samples do not depend on the other rows (the codec step
    pads every call to `decode_batch` rows for this)."""
    _, ours = tiny
    codes = random_codes(6, batch=4, seed=4)
    seeds, starts = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 8, 16, 24])
    a = ours.decode(codes, PositionalNoise(seeds, starts))
    perm = [2, 0, 3, 1]
    b = ours.decode([c[perm] for c in codes], PositionalNoise(seeds[perm], starts[perm]))
    for i, j in enumerate(perm):
        assert torch.equal(b[i], a[j])
    assert np.isfinite(a.numpy()).all()
