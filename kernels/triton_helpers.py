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



# --------------------------------------------------------------------- shared memory of a launch

_STAGES: dict[tuple, int] = {}


def deepest_fitting(stages: tuple[int, ...], shared_of, limit: int) -> int:
    """The first of `stages` whose `shared_of(stages)` (bytes of shared memory a block) is within `limit`."""
    for s in stages:
        if shared_of(s) <= limit:
            return s
    raise RuntimeError(f"no pipeline depth of {stages} fits {limit} bytes of shared memory")


def fitting_stages(kernel, grid, args: tuple, kwargs: dict, device: torch.device,
                   stages: tuple[int, ...] = (3, 2, 1)) -> int:
    """The deepest software pipeline (`num_stages`, the first of `stages`) whose shared memory fits
    `device`. Triton's default of 3 stages keeps three iterations' tiles of a loop in shared memory:
    the delta rule's scan asked 262,144 bytes that way on an H200 (232,448 a block) and failed at
    launch, on the GPU only (the interpreter checks nothing). `kwargs`: the launch's constexprs and
    options but num_stages. Compiled, not launched, once per kernel, device, kwargs and argument
    dtypes; off the GPU (the interpreter has no stages) the first."""
    if device.type != "cuda" or dispatch.INTERPRETER:
        return stages[0]
    key = (kernel.fn.__name__, device.index, tuple(sorted(kwargs.items())),
           tuple(getattr(a, "dtype", None) for a in args))
    if key not in _STAGES:
        limit = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)["max_shared_mem"]
        _STAGES[key] = deepest_fitting(
            stages, lambda s: kernel.warmup(*args, grid=grid, num_stages=s, **kwargs).metadata.shared, limit)
    return _STAGES[key]
