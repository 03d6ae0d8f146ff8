"""Triton kernels for a decoder layer's row-wise ops; kernels.norms_reference defines what each computes.

    rms_norm                 (x [+ residual]) -> norm, fused add + norm, BLOCK_M rows a program
    silu_and_mul             silu(gate) * up for a fused gate/up projection
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_omni.kernels.triton_helpers import (FLOATS, norm_scale, residual_add, silu_mul, use_pdl,
                                                  wait_for_earlier_kernels)


def _rows3(x: torch.Tensor) -> torch.Tensor:
    """View x [..., D] as [n0, n1, D] with a unit last stride, copying only when a view is impossible.

    Three dims cover the common strided inputs without a copy: [T, D] rows, and [T, H, D] heads cut
    out of a fused projection (e.g. `qkv.split(...)[0].view(T, H, D)`)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    if x.dim() > 3:
        return x.reshape(-1, *x.shape[-2:])
    return x


# --------------------------------------------------------------------------------------------------
# RMSNorm (optionally fused with the residual add)
# --------------------------------------------------------------------------------------------------

@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, s_ptr,
    n_rows, n1, stride_x0, stride_x1, stride_r0, stride_r1,
    D, eps,
    HAS_RESIDUAL: tl.constexpr, ZERO_CENTERED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_earlier_kernels(USE_PDL)
    # BLOCK_M rows a program (several for short rows such as per-head norms, one for hidden states)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    i, j = rows // n1, rows % n1                          # row -> (outer, inner) index of the [n0, n1, D] view
    offs = tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (offs < D)[None, :]
    out_offs = rows[:, None] * D + offs[None, :]          # outputs are contiguous

    x = tl.load(x_ptr + (i * stride_x0 + j * stride_x1)[:, None] + offs[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # s = x + residual, rounded to x's dtype; it is both the new residual and the norm's input
        r = tl.load(res_ptr + (i * stride_r0 + j * stride_r1)[:, None] + offs[None, :], mask=mask, other=0.0)
        x = residual_add(x, r)
        tl.store(s_ptr + out_offs, x, mask=mask)

    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=1) / D + eps)[:, None]
    w = tl.load(w_ptr + offs, mask=offs < D, other=0.0).to(tl.float32)[None, :]
    y = norm_scale(h, w, x.dtype, ZERO_CENTERED)
    tl.store(y_ptr + out_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             zero_centered: bool = False):
    """norm(x [+ residual]) over the last dim; returns (y, x + residual) when a residual is given."""
    D = x.shape[-1]
    assert x.dtype in FLOATS and weight.shape == (D,), (x.dtype, weight.shape, D)
    assert weight.device == x.device
    weight = weight.contiguous()
    # the reference multiplies `weight * h.to(x.dtype)`, so the output takes the promoted dtype
    out_dtype = x.dtype if zero_centered else torch.promote_types(weight.dtype, x.dtype)
    x3 = _rows3(x)
    n0, n1 = x3.shape[0], x3.shape[1]
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, (residual.shape, residual.dtype)
        r3 = _rows3(residual)
        s = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        r3, s = x3, y                                     # unused (HAS_RESIDUAL=False)
    if x.numel() == 0:
        return y if residual is None else (y, s)

    n_rows = n0 * n1
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_M = min(triton.next_power_of_2(n_rows), max(1, 2048 // BLOCK_D))   # ~2K elements a program
    num_warps = min(max(BLOCK_M * BLOCK_D // 512, 1), 16)                    # ~16 a thread; 8 warps at D=4096
    pdl = use_pdl(x)
    _rms_norm_kernel[(triton.cdiv(n_rows, BLOCK_M),)](
        x3, r3, weight, y, s,
        n_rows, n1, x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1),
        D, eps,
        HAS_RESIDUAL=residual is not None, ZERO_CENTERED=zero_centered, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D,
        USE_PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
    )
    return y if residual is None else (y, s)


# --------------------------------------------------------------------------------------------------
# SiLU-and-mul (gated MLP activation)
# --------------------------------------------------------------------------------------------------

@triton.jit
def _silu_and_mul_kernel(x_ptr, y_ptr, stride_x, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + I + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * I + offs, silu_mul(gate, up), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:]  ([..., I], x's dtype)."""
    assert x.dtype in FLOATS and x.shape[-1] % 2 == 0, (x.dtype, x.shape)
    I = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * I)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((*x.shape[:-1], I), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    BLOCK = min(triton.next_power_of_2(I), 1024)
    _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(I, BLOCK))](x2, y, x2.stride(0), I, BLOCK=BLOCK, num_warps=4)
    return y

