"""The decode step's bookkeeping ops: ar.bookkeeping's Triton kernels or their torch references
(ar.bookkeeping_reference), chosen per call as every kernel op is (kernels.dispatch.routed)."""
from __future__ import annotations

from triton_omni.ar import bookkeeping_reference as reference
from triton_omni.kernels.dispatch import routed

KERNELS = "triton_omni.ar.bookkeeping"

decode_inputs = routed(KERNELS)(reference.decode_inputs)
decode_finish = routed(KERNELS)(reference.decode_finish)
argmax = routed(KERNELS)(reference.argmax)
