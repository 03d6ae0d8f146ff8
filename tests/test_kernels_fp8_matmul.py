"""FP8 (E4M3) weights: the format's round trip, kernels/fp8_matmul.py's Triton kernels against their
torch references (kernels/fp8_matmul_reference.py), the torch._scaled_mm path's scale layouts, and the
kernels' shared memory on a Hopper GPU.

Without CUDA the kernels run under Triton's interpreter, which reads and writes fp8 tensors (as
uint8) but rounds fp32 -> fp8 wrongly where rounding carries into the exponent (124.3 becomes 64, not
128: its software conversion drops the carry). The skinny kernels only widen fp8, which it does
right, so they are held to the reference as on a GPU; quantize_rows, which narrows, is held to it
exactly on a GPU and, under the interpreter, everywhere but at those values (where its result must be
the interpreter's known wrong one, so the test still fails on any other difference).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.kernel_cases import CUDA, DEVICE, INTERPRETER_WARNINGS, generator, randn
from triton_omni.kernels import fp8_matmul as ops, fp8_matmul_reference as reference, fp8_scaled_mm

pytestmark = INTERPRETER_WARNINGS

H200_SHARED = 232448          # bytes of shared memory a block may opt in to on an H100 / H200


def spread_weight(N, K, gen, spread=2.0):
    """Rows (and 32-column blocks) of very different magnitudes, as real weights have: a scale applied
    to the wrong row or block shows."""
    rows = torch.exp(spread * (torch.rand(N, 1, generator=gen, device=DEVICE) - 0.5))
    cols = torch.exp(spread * (torch.rand(1, -(-K // 32), generator=gen, device=DEVICE) - 0.5)).repeat_interleave(32, 1)
    return randn(N, K, gen=gen) * rows * cols[:, :K] / K ** 0.5


# --- the format -------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [None, (16, 32), (128, 128)])
def test_quantize_dequantize_round_trip(block):
    """Each weight within half an E4M3 step of itself (2^-4 relative; the subnormals' absolute step
    below 2^-6 s), every row's (block's) largest at +-448 s, and quantizing the dequantized weight
    again gives the same values and scales."""
    g = generator(1)
    w = spread_weight(70, 300, g)
    q, s = reference.quantize_weight(w, block)
    assert q.dtype == reference.FP8 and s.dtype == torch.float32
    assert s.shape == ((70,) if block is None else (-(-70 // block[0]), -(-300 // block[1])))
    full = reference.expand_scale(s, 70, 300)
    back = reference.dequantize_weight(q, s)
    assert torch.all((back - w).abs() <= 2 ** -4 * w.abs() + 2 ** -10 * full)
    peaks = (q.float().abs() * (w.abs() == w.abs().amax(1, keepdim=True))).amax(1) if block is None else None
    if peaks is not None:
        assert torch.all(peaks == 448)
    q2, s2 = reference.quantize_weight(back, block)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    torch.testing.assert_close(s2, s, rtol=1e-6, atol=0)


def test_scale_blocks_read_off_the_shapes():
    assert reference.scale_blocks((4096, 4096), (4096,)) is None
    assert reference.scale_blocks((4096, 12288), (32, 96)) == (128, 128)
    assert reference.scale_blocks((100, 300), (1, 3)) == (128, 128)
    assert reference.scale_blocks((70, 300), (5, 10)) == (16, 32)
    with pytest.raises(ValueError, match="power-of-two"):
        reference.scale_blocks((300, 300), (7, 3))
    with pytest.raises(ValueError, match="per-channel"):
        reference.scale_blocks((64, 64), (32,))


# --- the skinny kernels -----------------------------------------------------------------------------
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
DTYPES = [torch.bfloat16, torch.float16] if CUDA else [torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K,block", [(40, 24, None), (70, 300, (16, 32)), (9, 1100, None), (32, 2100, (8, 128))])
@pytest.mark.parametrize("gated", [False, True])
def test_skinny_fp8_linear(dtype, N, K, block, gated):
    """N and K not multiples of the tiles or the blocks; K past one tile."""
    g = generator(2)
    q, s = reference.quantize_weight(spread_weight(N, K, g), block)
    x = (randn(1, 2 * K if gated else K, gen=g) * 2).to(dtype)
    b = randn(N, gen=g).to(dtype)
    y = ops.skinny_fp8_linear(x, q, s, b, gated)
    torch.testing.assert_close(y, reference.fp8_linear(x, q, s, b, gated), atol=TOL[dtype][0], rtol=TOL[dtype][1])


@pytest.mark.parametrize("block", [None, (16, 32)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_skinny_fp8_norm_linear(block, with_residual):
    g = generator(3)
    dtype = DTYPES[0]
    N, K = 48, 1100
    q, s = reference.quantize_weight(spread_weight(N, K, g), block)
    x = (randn(1, K, gen=g) * 3).to(dtype)
    res = randn(1, K, gen=g).to(dtype) if with_residual else None
    nw = randn(K, gen=g).to(dtype)
    y, new_res = ops.skinny_fp8_norm_linear(x, res, nw, 1e-6, False, q, s)
    ref_y, ref_res = reference.fp8_norm_linear(x, res, nw, 1e-6, False, q, s)
    torch.testing.assert_close(y, ref_y, atol=TOL[dtype][0], rtol=TOL[dtype][1])
    assert torch.equal(new_res, ref_res)


@pytest.mark.parametrize("mutation", ["missing", "other row", "other column block"])
def test_skinny_fp8_linear_fails_with_misapplied_scales(mutation):
    """The kernel against the reference fed the same misapplied scales: the check is not blind to them."""
    g = generator(4)
    q, s = reference.quantize_weight(spread_weight(64, 256, g), (16, 32))
    x = randn(1, 256, gen=g).to(DTYPES[0])
    wrong = {"missing": torch.ones_like(s), "other row": s.roll(1, 0), "other column block": s.roll(1, 1)}[mutation]
    good = ops.skinny_fp8_linear(x, q, s)
    assert not torch.allclose(good, reference.fp8_linear(x, q, wrong), atol=1e-2, rtol=1e-1)


# --- activation quantization and torch._scaled_mm --------------------------------------------------
def _interpreter_carry_flaw(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Where the interpreter's fp32 -> fp8 rounding drops a carry into the exponent: the right value is
    a power of two and it wrote half of it."""
    w, v = want.float().abs(), got.float().abs()
    power_of_two = torch.exp2(torch.log2(w).round()) == w
    return power_of_two & (v == w / 2) & (torch.sign(got.float()) == torch.sign(want.float()))


@pytest.mark.parametrize("M,K,group,gated", [(3, 100, 0, False), (4, 300, 128, False), (2, 70, 0, True),
                                             (2, 5000, 0, False)])
def test_quantize_rows(M, K, group, gated):
    g = generator(5)
    x = randn(M, 2 * K if gated else K, gen=g) * 3
    x[0, :8] = 0.0
    q, s = ops.quantize_rows(x, group, gated)
    q_ref, s_ref = reference.quantize_rows(x, group, gated)
    assert torch.equal(s, s_ref)
    differ = q.view(torch.uint8) != q_ref.view(torch.uint8)
    if not CUDA:
        differ &= ~_interpreter_carry_flaw(q, q_ref)
    assert not differ.any(), (q.float()[differ], q_ref.float()[differ])


def test_w8a8_reference_quantizes_the_rows():
    """Rows scaled by very different factors come out relatively as exact as one another."""
    g = generator(6)
    q, s = reference.quantize_weight(spread_weight(48, 64, g))
    x = randn(4, 64, gen=g) * torch.tensor([[1e-3], [1.0], [30.0], [1e3]], device=DEVICE)
    exact = x @ reference.dequantize_weight(q, s).T
    rel = ((reference.w8a8_linear(x, q, s) - exact).norm(dim=1) / exact.norm(dim=1))
    assert rel.max() < 0.05 and rel.min() > 0


def _cpu_scaled_mm() -> bool:
    try:
        a = torch.zeros(16, 16, dtype=reference.FP8)
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
        return True
    except (RuntimeError, NotImplementedError):
        return False


@pytest.mark.skipif(not CUDA and not _cpu_scaled_mm(), reason="this torch has no row-wise torch._scaled_mm here")
def test_scaled_mm_rowwise_layouts_equal_the_reference():
    """torch._scaled_mm (cuBLASLt on a GPU; torch's CPU kernel here) with the scales laid out as
    fp8_scaled_mm lays them out computes w8a8_linear; a transposed activation scale would not."""
    g = generator(7)
    q, s = reference.quantize_weight(spread_weight(48, 64, g))
    x = randn(32, 64, gen=g) * torch.exp(randn(32, 1, gen=g))
    want = reference.w8a8_linear(x, q, s).bfloat16()
    xq, sx = reference.quantize_rows(x)
    got = fp8_scaled_mm.scaled_mm_rowwise(xq, sx, q, s)
    torch.testing.assert_close(got, want, atol=1e-2 * want.abs().max().item(), rtol=2e-2)
    mixed = torch._scaled_mm(xq, q.t(), scale_a=sx.roll(1, 0).contiguous(), scale_b=s.view(1, -1),
                             out_dtype=torch.bfloat16)
    assert not torch.allclose(mixed, want, atol=1e-2 * want.abs().max().item(), rtol=2e-2)


@pytest.mark.skipif(not CUDA, reason="torch._scaled_mm on the GPU")
@pytest.mark.parametrize("block", [None, (128, 128)])
@pytest.mark.parametrize("gated", [False, True])
def test_scaled_mm_linear_on_the_gpu(block, gated):
    g = generator(8)
    q, s = reference.quantize_weight(spread_weight(1024, 512, g), block)
    x = randn(64, 1024 if gated else 512, gen=g).bfloat16()
    if block is not None and fp8_scaled_mm.blockwise_layout(q.device) is None:
        # torch 2.11 on an H200 has none: block weights are requantized per channel at load instead
        pytest.skip("no block-scaled torch._scaled_mm on this GPU")
    want = reference.w8a8_linear(x, q, s, None, gated)
    got = fp8_scaled_mm.scaled_mm_linear(x, q, s, None, gated, rows=ops.quantize_rows)
    torch.testing.assert_close(got, want, atol=2e-2 * want.abs().max().item(), rtol=2e-2)


@pytest.mark.skipif(not CUDA, reason="decode shapes: CUDA only")
@pytest.mark.parametrize("N,K,gated,block", [(4096, 1024, False, None), (1024, 3072, True, None),
                                             (6144, 4096, False, (128, 128)), (4096, 12288, True, (128, 128)),
                                             (151936, 4096, False, None)])
def test_skinny_fp8_linear_decode_shapes(N, K, gated, block):
    g = generator(9)
    q, s = reference.quantize_weight(randn(N, K, gen=g) / K ** 0.5, block)
    x = randn(1, 2 * K if gated else K, gen=g).bfloat16()
    torch.testing.assert_close(ops.skinny_fp8_linear(x, q, s, None, gated), reference.fp8_linear(x, q, s, None, gated),
                               atol=2e-2, rtol=2e-2)


# --- shared memory on Hopper ---------------------------------------------------------------------------
COMPILE = r'''
import json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_omni.kernels import fp8_matmul as k

HOPPER = GPUTarget("cuda", 90, 32)


def shared_bytes(kernel, types, constexprs, **options):
    sig = {n: types.get(n, "i32") for n in kernel.arg_names}
    sig.update({c: "constexpr" for c in constexprs})
    return triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs), target=HOPPER,
                          options=options).metadata.shared


skinny = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "b_ptr": "*bf16", "y_ptr": "*bf16",
          "res_ptr": "*bf16", "nw_ptr": "*bf16", "s_ptr": "*bf16", "eps": "fp32"}
out = {}
for N, K, gated, norm, bn in json.loads(sys.argv[1]):
    block_n, block_k, warps = k._fp8_config(N, K, gated, bn)
    c = dict(SCALE_BN=bn, SCALE_BK=bn, HAS_BIAS=False, GATED=gated, NORM=norm, HAS_RESIDUAL=norm,
             ZERO_CENTERED=False, BLOCK_N=block_n, BLOCK_K=block_k, USE_PDL=True)
    out[f"skinny {N}x{K}"] = shared_bytes(k._skinny_fp8_kernel, skinny, c, num_warps=warps)
out["quantize_rows"] = shared_bytes(k._quantize_rows_kernel, {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32"},
                                    dict(GATED=True, BLOCK_K=4096), num_warps=8)
print(json.dumps(out))
'''


def test_fp8_kernels_fit_hopper_shared_memory():
    """Compiled for sm_90 as ptxas builds them there (no interpreter in that process), at the Qwen3-8B
    decode shapes' tiles: q/k/v with the norm folded in (per block), o_proj, down_proj gated."""
    shapes = [(6144, 4096, False, True, 128), (4096, 4096, False, False, 0), (4096, 12288, True, False, 0)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(shapes)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    sizes = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(sizes) == 4 and all(0 <= v <= H200_SHARED for v in sizes.values()), sizes
