"""kernels.dispatch.routed, the one place that picks an op's Triton kernel or its torch path per call."""
from __future__ import annotations

import importlib
import inspect
import sys
from types import SimpleNamespace

import pytest
import torch

import triton_omni.ar.bookkeeping_dispatch  # noqa: F401 - routes the engine's bookkeeping ops too
from triton_omni.kernels import dispatch, norms_reference


def _kernel(x, flag=None):
    return "kernel"


def _torch_path(x, flag=None):
    return "torch"


def test_routed_takes_the_kernel_only_when_enabled_on_cuda_and_it_applies(monkeypatch):
    monkeypatch.setattr(dispatch, "ROUTES", [])
    op = dispatch.routed(__name__, "_kernel", applies=lambda x, flag=None: flag != "too wide")(_torch_path)
    assert dispatch.ROUTES == [(_torch_path, __name__, "_kernel")]
    on_cuda, on_cpu = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)
    monkeypatch.setattr(dispatch, "_enabled", False)
    assert op(on_cuda) == "torch"
    monkeypatch.setattr(dispatch, "_enabled", True)
    assert op(on_cuda) == "kernel" and op(on_cuda, flag="narrow") == "kernel"
    assert op(on_cpu) == "torch" and op(on_cuda, flag="too wide") == "torch"


def test_every_routed_kernel_takes_its_torch_paths_arguments():
    """The kernel is called with the torch path's arguments: the same names in the same places (it may
    take more after them, e.g. the attention's split count)."""
    pytest.importorskip("triton")
    assert len(dispatch.ROUTES) >= 12
    for torch_path, module, name in dispatch.ROUTES:
        kernel = getattr(importlib.import_module(module), name)
        want = list(inspect.signature(torch_path).parameters)
        assert list(inspect.signature(kernel).parameters)[:len(want)] == want, (module, name)


def test_enable_imports_every_kernel_module_and_cpu_tensors_keep_the_torch_path(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setattr(dispatch, "_enabled", False)       # restored after the test
    dispatch.enable(True)
    assert dispatch.enabled()
    assert {module for _, module, _ in dispatch.ROUTES} <= set(sys.modules)
    x, w = torch.randn(3, 16), torch.randn(16)
    assert torch.equal(dispatch.rms_norm(x, w, 1e-6), norms_reference.rms_norm(x, w, 1e-6))
