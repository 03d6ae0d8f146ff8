"""kernels/norms.py's Triton kernels against their torch references (kernels/norms_reference.py).

On a machine with CUDA the kernels run for real (fp32, bf16 and fp16); without it they run under the
Triton interpreter on the CPU (fp32 only, small shapes: the interpreter is slow).
"""
from __future__ import annotations

import pytest
import torch

from tests.kernel_cases import CUDA, DTYPES, INTERPRETER_WARNINGS, TOL, close, generator, randn
from triton_omni.kernels import norms as ops, norms_reference as reference

pytestmark = INTERPRETER_WARNINGS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (5, 37), (3, 256), (2, 3, 24), (300, 64)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_rms_norm(dtype, shape, with_residual, zero_centered):
    g = generator(0)
    D = shape[-1]
    x = randn(*shape, dtype=dtype, gen=g) * 3
    w = randn(D, dtype=dtype, gen=g) * (0.1 if zero_centered else 1.0)
    res = randn(*shape, dtype=dtype, gen=g) if with_residual else None
    eps = 1e-6
    out = ops.rms_norm(x, w, eps, res, zero_centered)
    ref = reference.rms_norm(x, w, eps, res, zero_centered)
    if with_residual:
        close(out[0], ref[0], TOL[dtype])
        assert torch.equal(out[1], ref[1])               # the residual sum is exact in x's dtype
    else:
        close(out, ref, TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_heads(dtype):
    """Per-head norm (q_norm/k_norm) on a [T, H, D] view cut out of a fused qkv projection."""
    g = generator(1)
    T, Hq, Hk, D = 20, 4, 2, 40                          # 80 and 40 rows: several programs a tensor
    qkv = randn(T, (Hq + 2 * Hk) * D, dtype=dtype, gen=g)
    q, k, _ = qkv.split([Hq * D, Hk * D, Hk * D], dim=-1)
    qh, kh = q.view(T, Hq, D), k.view(T, Hk, D)
    assert not qh.is_contiguous()
    w = randn(D, dtype=dtype, gen=g)
    for x in (qh, kh):
        close(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), TOL[dtype])


@pytest.mark.skipif(not CUDA, reason="mixed dtypes: CUDA only")
def test_rms_norm_fp32_weight_bf16_input():
    g = generator(2)
    x = randn(7, 96, dtype=torch.bfloat16, gen=g)
    w = randn(96, gen=g)
    out, ref = ops.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5)
    assert out.dtype == torch.float32
    close(out, ref, TOL[torch.float32])


def test_rms_norm_detects_wrong_weight():
    """The comparison can fail: a perturbed weight must not pass."""
    g = generator(3)
    x, w = randn(4, 32, gen=g), randn(32, gen=g)
    w2 = w.clone()
    w2[5] += 0.5
    with pytest.raises(AssertionError):
        close(ops.rms_norm(x, w2, 1e-6), reference.rms_norm(x, w, 1e-6), TOL[torch.float32])


# ------------------------------------------------------------------------------------------ silu*mul

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (3, 14), (2, 5, 128), (4, 600)])
def test_silu_and_mul(dtype, shape):
    g = generator(5)
    x = randn(*shape, dtype=dtype, gen=g) * 4
    close(ops.silu_and_mul(x), reference.silu_and_mul(x), TOL[dtype])


@pytest.mark.skipif(not CUDA, reason="large shape: CUDA only")
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_large(dtype):
    x = randn(37, 2 * 3072 + 2 * 5, dtype=dtype, gen=generator(6))
    close(ops.silu_and_mul(x), reference.silu_and_mul(x), TOL[dtype])
