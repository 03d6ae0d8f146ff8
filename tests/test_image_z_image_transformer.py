"""The Z-Image transformer's split forward (python_backends/image/z_image/transformer.py) equals
diffusers' ZImageTransformer2DModel.forward: captions of different padded lengths (key masks and a
gathered [image, caption] layout), image grids with and without pad tokens, per-item timesteps."""
import pytest
import torch

from triton_omni.image.z_image import transformer as z_image_transformer


@pytest.fixture(scope="module")
def model():
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(0)
    m = ZImageTransformer2DModel(in_channels=4, dim=64, n_layers=2, n_refiner_layers=2, n_heads=2, n_kv_heads=2,
                                 cap_feat_dim=32, axes_dims=[8, 12, 12], axes_lens=[256, 64, 64]).eval()
    with torch.no_grad():      # the release's init leaves pad tokens and modulations at zero: make every weight count
        for p in m.parameters():
            p.normal_(0, 0.2)
    return m


@pytest.mark.parametrize("cap_lens,grid", [
    ([5, 40, 70], (1, 6, 10)),      # padded captions 32 / 64 / 96: masks + gather; 15 patches + 17 pad tokens
    ([5, 20], (1, 16, 16)),         # both captions pad to 32: plain concatenation; 64 patches, no pad tokens
    ([33], (1, 4, 4)),              # one item
])
def test_split_forward_equals_the_models_forward(model, cap_lens, grid):
    g = torch.Generator().manual_seed(1)
    captions = [torch.randn(n, 32, generator=g) for n in cap_lens]
    x = torch.randn(len(cap_lens), 4, *grid, generator=g)
    t = torch.rand(len(cap_lens), generator=g)
    with torch.inference_mode():
        want = torch.stack(model(list(x.unbind(0)), t, captions, return_dict=False)[0])
        ctx = z_image_transformer.prepare(model, captions, grid)
        got = z_image_transformer.step(model, ctx, x, t)
        again = z_image_transformer.step(model, ctx, x * 0.5, t.flip(0))     # the context serves every step
        want_again = torch.stack(model(list((x * 0.5).unbind(0)), t.flip(0), captions, return_dict=False)[0])
    assert got.shape == want.shape == x.shape
    assert want.abs().mean() > 0.1
    assert (got - want).abs().max() < 1e-5
    assert (again - want_again).abs().max() < 1e-5


def test_real_rotary_blocks_equal_the_models_forward(model):
    """The compiled path's attention (RoPE as real (cos, sin) pairs, `use_real_rotary`) computes the
    products of diffusers' complex ones; a wrong sign in the rotation would not pass."""
    import copy

    real = copy.deepcopy(model)
    z_image_transformer.use_real_rotary(real)
    g = torch.Generator().manual_seed(2)
    captions = [torch.randn(n, 32, generator=g) for n in (5, 40)]
    x, t = torch.randn(2, 4, 1, 6, 10, generator=g), torch.rand(2, generator=g)
    with torch.inference_mode():
        want = torch.stack(model(list(x.unbind(0)), t, captions, return_dict=False)[0])
        got = z_image_transformer.step(real, z_image_transformer.prepare(real, captions, (1, 6, 10), real_rotary=True), x, t)
        q = torch.randn(1, 3, 2, 8, generator=g)
        angle = torch.rand(1, 3, 4, generator=g) * 6
        cis = torch.polar(torch.ones_like(angle), angle)
        rotated = z_image_transformer.rotate(q, torch.view_as_real(cis))
        by_complex = torch.view_as_real(torch.view_as_complex(q.unflatten(-1, (-1, 2))) * cis.unsqueeze(2)).flatten(3)
    assert (got - want).abs().max() < 1e-5
    assert (rotated - by_complex).abs().max() < 1e-6      # float32 rounding (complex kernels may use FMAs)


def test_real_rotary_blocks_share_one_processor_class(model):
    """torch.compile shares one compiled block among the layers only if their processors are of one class."""
    import copy

    real = copy.deepcopy(model)
    z_image_transformer.use_real_rotary(real)
    kinds = {type(layer.attention.processor) for layer in (*real.noise_refiner, *real.layers)}
    assert len(kinds) == 1 and kinds != {type(model.layers[0].attention.processor)}
