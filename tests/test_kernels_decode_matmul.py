"""kernels/decode_matmul.py's Triton kernels against their torch references (kernels/decode_matmul_reference.py).

On a machine with CUDA the kernels run for real (fp32, bf16 and fp16); without it they run under the
Triton interpreter on the CPU (fp32 only, small shapes: the interpreter is slow).
"""
from __future__ import annotations

import math

import pytest
import torch

from tests.kernel_cases import CUDA, DTYPES, INTERPRETER_WARNINGS, close, generator, randn
from triton_omni.kernels import decode_matmul as ops, decode_matmul_reference as reference

pytestmark = INTERPRETER_WARNINGS


SKINNY_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K", [(40, 24), (70, 300), (9, 1100), (5, 2100)])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear(dtype, N, K, gated, bias):
    """N and K not multiples of the tiles; K past one tile (1100 with 512-wide tiles, 2100 with 1024)."""
    g = generator(7)
    x = randn(1, 2 * K if gated else K, dtype=dtype, gen=g) * 2
    w = (randn(N, K, gen=g) / math.sqrt(K)).to(dtype)
    b = randn(N, dtype=dtype, gen=g) if bias else None
    close(ops.skinny_linear(x, w, b, gated), reference.linear(x, w, b, gated), SKINNY_TOL[dtype])


def test_skinny_linear_reads_a_strided_row_and_detects_a_wrong_weight():
    g = generator(8)
    qkv = randn(3 * 32, gen=g)
    x = qkv[None, 32:64:1]                                # a view into a fused projection
    w = randn(48, 32, gen=g)
    ref = reference.linear(x, w)
    close(ops.skinny_linear(x, w), ref, SKINNY_TOL[torch.float32])
    w2 = w.clone()
    w2[47, 31] += 1.0                                     # the last row's last column: masks are right
    assert not torch.allclose(ops.skinny_linear(x, w2), ref, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K", [(40, 24), (9, 1100), (5, 2100)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_skinny_norm_linear(dtype, N, K, with_residual, zero_centered):
    """The (residual add +) RMSNorm folded into the matmul: same output and new residual as the norm
    kernel followed by the matmul; K past one tile, so the sum of squares spans several."""
    g = generator(10)
    x = randn(1, K, dtype=dtype, gen=g) * 3
    res = randn(1, K, dtype=dtype, gen=g) if with_residual else None
    nw = randn(K, dtype=dtype, gen=g) * (0.1 if zero_centered else 1.0)
    w = (randn(N, K, gen=g) / math.sqrt(K)).to(dtype)
    b = randn(N, dtype=dtype, gen=g)
    y, s = ops.skinny_norm_linear(x, res, nw, 1e-6, zero_centered, w, b)
    ref_y, ref_s = reference.norm_linear(x, res, nw, 1e-6, zero_centered, w, b)
    close(y, ref_y, SKINNY_TOL[dtype])
    assert torch.equal(s, ref_s)                          # the residual sum is exact in x's dtype
    if not with_residual:
        assert s is x


@pytest.mark.skipif(not CUDA, reason="decode shapes: CUDA only")
@pytest.mark.parametrize("N,K,gated", [(4096, 1024, False), (1024, 2048, False), (1024, 3072, True),
                                       (24576, 4096, False), (4096, 12288, True), (151936, 1024, False)])
def test_skinny_linear_decode_shapes(N, K, gated):
    g = generator(9)
    x = randn(1, 2 * K if gated else K, dtype=torch.bfloat16, gen=g)
    w = (randn(N, K, gen=g) / math.sqrt(K)).to(torch.bfloat16)
    close(ops.skinny_linear(x, w, None, gated), reference.linear(x, w, None, gated), SKINNY_TOL[torch.bfloat16])
