"""FP8 weights times many rows (prefill, decode batches, diffusion transformers): the activations
quantized to E4M3 too and multiplied by torch._scaled_mm (cuBLASLt's FP8 tensor-core GEMM, fp32
accumulation), what kernels.fp8_matmul_reference.w8a8_linear defines.

Per-channel weights: one activation scale a row (row-wise scaling, [M, 1] x [1, N]). Block weights
(128 x 128, the released checkpoints'): one activation scale per 128 columns of a row against the
weight blocks (torch's BlockWise1x128 x BlockWise128x128), where this torch and GPU take it; which scale
layouts it takes is probed once per device (`blockwise_layout`). Elsewhere (other blocks, shapes whose
sides are not multiples of 16, a device without FP8 GEMMs, the CPU) the reference computes the same maths.
"""
from __future__ import annotations

import functools

import torch

from triton_omni.kernels import fp8_matmul_reference as reference

# cuBLASLt FP8 GEMMs need both sides of the weight to be multiples of 16
ALIGN = 16
# fp32 accumulation throughout (use_fast_accum=False): the fast mode's periodic promotion loses bits
# on long K, and the rows it would gain have not been measured here yet
FAST_ACCUM = False


def fp8_gemm_device(device) -> bool:
    """Whether `device` runs torch._scaled_mm (CUDA compute capability 8.9 and later): checked when FP8
    weights are made (models/quant.py), so the matmul itself looks at `x.is_cuda` alone (which a
    compiled module's guards can follow)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _aligned(weight: torch.Tensor) -> bool:
    return weight.shape[0] % ALIGN == 0 and weight.shape[1] % ALIGN == 0


def scaled_mm_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                     gated: bool = False, rows=reference.quantize_rows) -> torch.Tensor:
    """x [M, K] (gated: [M, 2K]) @ (weight fp8 [N, K] * scale).T (+ bias) -> [M, N] in x's dtype, the rows
    quantized to fp8 by `rows` (quantize_rows' signature: dispatch passes its routed one): torch._scaled_mm
    on CUDA where it applies, w8a8_linear's maths otherwise."""
    if not (x.is_cuda and _aligned(weight)):
        return reference.w8a8_linear(x, weight, scale, bias, gated)
    if scale.dim() == 1:
        y = scaled_mm_rowwise(*rows(x, 0, gated), weight, scale)
    else:
        layout = blockwise_layout(x.device) if reference.scale_blocks(weight.shape, scale.shape) == (128, 128) else None
        if layout is None:
            return reference.w8a8_linear(x, weight, scale, bias, gated)
        xq, sx = rows(x, 128, gated)
        sa, sb = layout(sx, scale)
        y = torch._scaled_mm(xq, weight.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                             use_fast_accum=FAST_ACCUM)
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


def scaled_mm_rowwise(xq: torch.Tensor, sx: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """torch._scaled_mm of quantized rows (scales [M, 1]) against per-channel weights, bf16 out (row-wise
    scaling's only output type). Any device that runs it: the CPU's too, which is how the tests hold these
    scale layouts to the reference."""
    return torch._scaled_mm(xq, weight.t(), scale_a=sx, scale_b=scale.view(1, -1), out_dtype=torch.bfloat16,
                            use_fast_accum=FAST_ACCUM)


# Candidate layouts of the block scales: activation scales [M, K/128] and weight scales [K/128, N/128],
# as they are or laid out along the other dimension (cuBLASLt wants the outer dimension contiguous on
# some versions).
_LAYOUTS = (
    lambda sx, sw: (sx, sw.t()),
    lambda sx, sw: (sx.t().contiguous().t(), sw.t()),
    lambda sx, sw: (sx, sw.t().contiguous()),
    lambda sx, sw: (sx.t().contiguous().t(), sw.t().contiguous()),
)


@functools.lru_cache(maxsize=None)
def blockwise_layout(device: torch.device):
    """The first scale layout with which torch._scaled_mm computes block-scaled FP8 matmuls right on
    `device` (checked against the reference on a 3-block problem); None if it takes none. Called when
    block weights are loaded, never inside a CUDA graph capture."""
    if not fp8_gemm_device(device):
        return None
    g = torch.Generator(device=device).manual_seed(0)
    M, K, N = 48, 384, 256
    x = torch.randn(M, K, device=device, generator=g, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=device, generator=g) * torch.rand(N, 1, device=device, generator=g)
    wq, ws = reference.quantize_weight(w, (128, 128))
    want = reference.w8a8_linear(x, wq, ws).float()
    xq, sx = reference.quantize_rows(x, 128)
    for layout in _LAYOUTS:
        try:
            sa, sb = layout(sx, ws)
            got = torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16).float()
        except (RuntimeError, ValueError):
            continue
        if torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item()):
            return layout
    return None
