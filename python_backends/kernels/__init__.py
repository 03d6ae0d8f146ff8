"""Triton kernels for the hot paths, each beside its torch reference (`reference.py`).

`dispatch` chooses per call: the Triton kernel for CUDA tensors when enabled, the reference
otherwise. Tests compare the two on random inputs (on the CPU under TRITON_INTERPRET=1).
"""
