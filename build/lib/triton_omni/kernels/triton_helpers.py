"""The Triton pieces more than one kernel module uses: the float dtypes the kernels take, programmatic
dependent launch (PDL), and the elementwise steps whose rounding several kernels must share (the
residual add and norm scale of rms_norm and the folded norm of skinny_norm_linear; silu(gate) * up of
silu_and_mul and the gated skinny_linear)."""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from triton_omni.kernels import dispatch

FLOATS = (torch.float32, torch.float16, torch.bfloat16)

# --------------------------------------------------------------------------------------------------
# Programmatic dependent launch (PDL, Hopper and later)
# --------------------------------------------------------------------------------------------------
#
# A batch-1 decode step is ~200 short kernels in a row (7 a layer), each only a few microseconds of
# weight reads: the gap between one kernel's end and the next one's start, and each kernel's ramp,
# are a large share of the step. Launched with PDL, a kernel may start while the one before it is
# still running: its programs first do what depends on no earlier kernel (the skinny matmuls load
# their first weight tile: no kernel of the step writes weights), then wait (`griddepcontrol.wait`:
# the earlier kernel has finished and its writes are visible), then allow the next kernel to start in
# turn. A kernel launched so must not touch any other tensor before that wait; kernels without it
# are launched the ordinary way. It holds inside CUDA graphs too (captured as programmatic edges).


@functools.lru_cache(maxsize=None)
def _pdl_device(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def use_pdl(x: torch.Tensor) -> bool:
    """Whether kernels on x's device are launched with PDL (switched off as a whole by
    kernels.dispatch.PDL: TRITON_OMNI_PDL=0, or the interpreter)."""
    return dispatch.PDL and x.is_cuda and _pdl_device(x.device)


@triton.jit
def wait_for_earlier_kernels(USE_PDL: tl.constexpr):
    """The earlier kernels' writes are visible after this; the next kernel may start (PDL launches)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


# ----------------------------------------------------- elementwise steps shared by several kernels

@triton.jit
def residual_add(x, r):
    """x + residual, rounded to x's dtype (both the new residual and the norm's input)."""
    return (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)


@triton.jit
def norm_scale(h, w, dtype, ZERO_CENTERED: tl.constexpr):
    """The normalised fp32 h times the norm weight (fp32), rounded as the reference rounds; fp32 out."""
    # one return at the end, as the kernels had it: the compiler need not follow returns in branches
    if ZERO_CENTERED:
        y = h * (1.0 + w)                                # (h * (1 + w.float())).to(x.dtype)
    else:
        y = w * h.to(dtype).to(tl.float32)               # weight * h.to(x.dtype), in the promoted dtype
    return y


@triton.jit
def silu_mul(gate, up):
    """silu(gate) * up in gate's dtype, rounded as the unfused pair rounds."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)       # F.silu rounds to the input dtype ...
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)   # ... then the product again

