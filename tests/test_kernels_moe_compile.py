"""kernels/moe.py's kernels compiled for Hopper (sm_90, as ptxas builds them on an H200) on the CPU, at
the configs the real MoE shapes launch: each compiles, and the shared memory it asks for is within the
bound its config computes (GroupedConfig.shared_memory) and within the 232,448 bytes a Hopper block may
have. The interpreter (how the other kernel tests run here) compiles nothing and checks no shared
memory, so without this a kernel could fail at its first launch on the GPU only.

Compiled as the runtime specialises a launch: pointers and the sizes and strides that are multiples of
16 carry their divisibility, which is what lets Triton pipeline the matmul loops (num_stages copies of
their tiles in shared memory).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from triton_omni.kernels.moe import HOPPER_SHARED_MEMORY

COMPILE = r'''
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_omni.kernels import moe

HOPPER = GPUTarget("cuda", 90, 32)
INT_PTRS = ("ids_ptr", "sorted_ptr", "block_expert_ptr")
FP32_PTRS = ("w_ptr_route", "wts_ptr")
ALIGNED = ("H", "I", "IS", "P", "stride_ht", "stride_we", "stride_wn", "stride_lt", "stride_xt", "stride_sgu",
           "stride_swn")


def shared_bytes(kernel, constexprs, fp32=(), **options):
    names = kernel.arg_names
    sig = {n: "constexpr" if n in constexprs else ("*i32" if n in INT_PTRS else "*fp32" if n in fp32 else "*bf16")
           if n.endswith("_ptr") else "fp32" if n == "eps" else "i32" for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n not in constexprs and (n.endswith("_ptr") or n in ALIGNED)}
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=HOPPER, options=options).metadata.shared


out = {}
# (E, k, H, I): Qwen3-30B-A3B; the grouped configs from a decode batch to a full prefill pass
E, k, H, I = 128, 8, 2048, 768
for tokens in (8, 512, moe.MAX_PAIRS_PER_PASS // k):
    c = moe.grouped_config(tokens * k, E, (H, H), 2)
    common = dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, DOT_PRECISION="tf32")
    options = dict(num_warps=c.num_warps, num_stages=c.num_stages)
    out[f"gate_up at {tokens} tokens {c}"] = (shared_bytes(moe._grouped_gate_up_kernel, dict(TOP_K=k, **common), **options),
                           c.shared_memory(2, 2))
    out[f"down at {tokens} tokens {c}"] = (shared_bytes(moe._grouped_down_kernel, common, fp32=("wts_ptr",), **options),
                        c.shared_memory(2, 1))
# Qwen3.5-35B-A3B's 256 experts (with a shared expert), Qwen3.5-397B-A17B's 512 for the router
block_t, block_e = moe.route_config(512)
out["route"] = (shared_bytes(moe._route_kernel, dict(TOP_K=10, RENORMALIZE=True, BLOCK_T=block_t, BLOCK_E=block_e,
                                                     BLOCK_K=16), fp32=("w_ptr",), num_warps=4), moe.route_shared_memory(512))
out["align"] = (shared_bytes(moe._align_kernel, dict(BLOCK_M=16, BLOCK_E=256, CHUNK=moe.ALIGN_CHUNK), num_warps=4), None)
n, kk = moe.gemv_config(512, 2048, 2)
out["gemv gate_up"] = (shared_bytes(moe._gemv_gate_up_kernel, dict(
    TOP_K=8, RENORMALIZE=True, NORM=True, ZERO_CENTERED=True, BLOCK_N=n, BLOCK_K=kk, BLOCK_E=256, BLOCK_TOPK=8,
    USE_PDL=True), fp32=("wts_ptr",), num_warps=4), None)
n, kk = moe.gemv_config(2048, 512, 8)
out["gemv down"] = (shared_bytes(moe._gemv_down_kernel, dict(TOP_K=8, BLOCK_TOPK=8, HAS_SHARED=True, BLOCK_N=n,
                                                            BLOCK_K=kk, BLOCK_KS=512, USE_PDL=True), fp32=("wts_ptr",),
                                 num_warps=4), None)
out["sum pairs"] = (shared_bytes(moe._sum_pairs_kernel, dict(TOP_K=8, HAS_SHARED=True, BLOCK_H=1024), num_warps=4), None)
print(json.dumps(out))
'''


def test_moe_kernels_compile_for_hopper_within_its_shared_memory():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    sizes = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(sizes) == 11, sizes
    for name, (compiled, bound) in sizes.items():
        assert compiled <= HOPPER_SHARED_MEMORY, (name, compiled)
        if bound is not None:
            assert compiled <= bound <= HOPPER_SHARED_MEMORY, (name, compiled, bound)
    # the grouped matmuls' loops are pipelined (more than one stage of tiles in shared memory)
    assert all(compiled >= 2 * 64 * 64 * 2 for name, (compiled, _) in sizes.items() if name.startswith("gate_up"))
