"""The Triton kernels whose loops Triton pipelines fit a Hopper GPU's shared memory, checked on the CPU.

The interpreter (how the other kernel tests run here) never checks shared memory; a kernel that asks
for more than a block may have fails at launch on the GPU only (the delta rule's scan did, at
Triton's default of 3 stages: 262,144 bytes against the H200's 232,448). Here the kernels are
compiled for sm_90, as ptxas builds them there, at the shapes the served models launch, in a process
without the interpreter (this one has it on: conftest), and the pipeline depth `fitting_stages` would
pick on an H200 must exist.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from triton_omni.kernels.triton_helpers import deepest_fitting

H200_SHARED = 232448          # bytes a block may opt in to on an H100 / H200

COMPILE = r'''
import json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_omni.kernels import gated_delta

dk, dv, stages = json.loads(sys.argv[1])
HOPPER = GPUTarget("cuda", 90, 32)
INTS = {"cu_ptr": "*i32", "first_ptr": "*i32", "seq_ptr": "*i32", "slot_ptr": "*i64"}


def shared_bytes(kernel, pointers, floats, constexprs, **options):
    sig = {n: pointers.get(n, "*fp32") if n.endswith("_ptr") else "fp32" if n in floats else "i32"
           for n in kernel.arg_names}
    sig.update({k: "constexpr" for k in constexprs})
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=HOPPER, options=options).metadata.shared


bk, bv = max(16, triton.next_power_of_2(dk)), max(16, triton.next_power_of_2(dv))
C, split = gated_delta.DELTA_CHUNK, min(bv, gated_delta.SCAN_SPLIT_V)
bf16 = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "a_ptr", "b_ptr")}
out = {"chunk": shared_bytes(gated_delta._gated_delta_chunk_kernel, {**INTS, **bf16}, ("q_scale",),
                             dict(C=C, BLOCK_K=bk, BLOCK_V=bv), num_warps=8)}
for s in stages:
    out[f"scan{s}"] = shared_bytes(gated_delta._gated_delta_scan_kernel, INTS, (),
                                   dict(C=C, BLOCK_K=bk, BLOCK_V=bv, SPLIT_V=split), num_warps=4, num_stages=s)
print(json.dumps(out))
'''


def compiled_sizes(dk: int, dv: int, stages: list[int]) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", COMPILE, json.dumps([dk, dv, stages])], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dk,dv", [(128, 128)])        # Qwen3.5-0.8B and -9B linear-attention heads
def test_delta_rule_prefill_fits_hopper_shared_memory(dk, dv):
    sizes = compiled_sizes(dk, dv, [3, 2])
    assert sizes["chunk"] <= H200_SHARED, sizes
    depth = deepest_fitting((3, 2), lambda s: sizes[f"scan{s}"], H200_SHARED)
    assert sizes[f"scan{depth}"] <= H200_SHARED, sizes      # at least 2 stages: the scan's loads stay pipelined


def test_deepest_fitting_takes_the_first_that_fits():
    need = {3: 262144, 2: 147456, 1: 49152}
    assert deepest_fitting((3, 2, 1), need.__getitem__, H200_SHARED) == 2
    assert deepest_fitting((3, 2, 1), need.__getitem__, 300000) == 3
    with pytest.raises(RuntimeError, match="fits 1000 bytes"):
        deepest_fitting((3, 2, 1), need.__getitem__, 1000)
