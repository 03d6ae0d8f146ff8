"""What the kernel tests share: the device and dtypes they run on, their tolerances and random inputs.

On a machine with CUDA the kernels run for real (fp32, bf16 and fp16); without it they run under the
Triton interpreter on the CPU (fp32 only, small shapes: the interpreter is slow). A test module that
imports this is skipped where `triton` is not installed.
"""
from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"                 # before triton is imported anywhere below

triton = pytest.importorskip("triton")

DEVICE = "cuda" if CUDA else "cpu"
# the interpreter trips a numpy deprecation when it runs a loop with loaded bounds; not ours
INTERPRETER_WARNINGS = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
DTYPES = [torch.float32, torch.bfloat16, torch.float16] if CUDA else [torch.float32]
# (atol, rtol) against the reference; low-precision outputs may differ by an ulp after rounding
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
ATTN_TOL = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def close(out, ref, tol):
    atol, rtol = tol
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def randn(*shape, dtype=torch.float32, gen=None):
    return torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float32).to(dtype)
