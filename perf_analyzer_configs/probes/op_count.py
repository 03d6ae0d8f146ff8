"""Kernels, host ops and host syncs of a model call, counted on the CPU as a GPU would see them
(kokoro_ops.py, delta_rule_ops.py beside it): a kernel is an aten op that is not a view
nor a bare allocation.

Nothing runs on a GPU here, so where a tensor would live is tracked by hand: model weights, and
whatever is made with `device=` or `.to(device)`, or from such tensors, live on "the device"; the rest
on the host. A sync is what blocks the host on CUDA: reading a device tensor (`.item()`, `.tolist()`,
`.cpu()`, `.numpy()`, `.to("cpu")`), copying a host tensor to the device (a pageable copy waits for
the stream), or an op whose output size depends on device data (`nonzero`, boolean masks,
`repeat_interleave` by a device tensor). Host ops (CPU work between launches) are counted apart.
Where a sync happens is reported by its call site outside torch and these scripts.
"""
from __future__ import annotations

import collections
import time
import traceback
import weakref
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

READS = {"item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__"}
SIZE_FROM_DATA = {"nonzero", "masked_select", "unique", "_unique2", "nonzero_static"}


def tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from tensors(y)


class Residency(TorchFunctionMode):
    """Which tensors would be on the device, and the host syncs that follow from it (by call site)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.dev = {id(t): weakref.ref(t) for t in [*model.parameters(), *model.buffers()]}   # weak: frees as it goes
        self.syncs = collections.Counter()
        self.host_call = False

    def on_dev(self, t: torch.Tensor) -> bool:
        ref = self.dev.get(id(t))
        return ref is not None and ref() is t

    def site(self) -> str:
        for frame in reversed(traceback.extract_stack()[:-2]):
            if "torch/" not in frame.filename and "perf_analyzer_configs/" not in frame.filename:
                return f"{Path(frame.filename).name}:{frame.lineno} {frame.line}"
        return "?"

    def sync(self, why: str):
        self.syncs[f"{why:<28} {self.site()}"] += 1

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        ins = list(tensors(args)) + list(tensors(kwargs))
        dev_in = any(self.on_dev(t) for t in ins)
        target = None                                   # where .to() sends it: "dev", "host" or None
        if name == "to":
            for a in list(args[1:]) + [kwargs.get("device")]:
                if isinstance(a, str) or isinstance(a, torch.device):
                    target = "host" if a == "cpu" and isinstance(a, str) else "dev"
                elif isinstance(a, torch.Tensor):
                    target = "dev" if self.on_dev(a) else "host"
        elif name == "cuda":
            target = "dev"
        elif name == "cpu":
            target = "host"
        device = kwargs.get("device")               # a torch.device, even cpu, is the model's device here
        made_on_dev = device is not None and not (isinstance(device, str) and device == "cpu") or target == "dev"
        src_dev = bool(ins) and self.on_dev(ins[0])
        if name in READS and src_dev or target == "host" and src_dev:
            self.sync(f"read {name}")
        elif target == "dev" and ins and not src_dev and ins[0].numel() > 0:
            self.sync("host->device copy")
        elif name == "tensor" and made_on_dev:
            self.sync("host->device copy")
        elif name in SIZE_FROM_DATA and dev_in:
            self.sync(name)
        elif name == "repeat_interleave" and dev_in and kwargs.get("output_size") is None and \
                any(isinstance(a, torch.Tensor) and self.on_dev(a) for a in list(args[1:]) + [kwargs.get("repeats")]):
            self.sync("repeat_interleave by tensor")
        elif name == "arange" and any(self.on_dev(t) for t in ins):
            self.sync("arange(device tensor)")
        elif name == "__getitem__" and dev_in and any(t.dtype == torch.bool for t in tensors(args[1:])):
            self.sync("boolean mask")
        on_dev = (dev_in or made_on_dev) and target != "host" and name not in READS
        self.host_call = not on_dev
        try:
            out = func(*args, **kwargs)
        finally:
            self.host_call = False
        for t in tensors(out):           # on the CPU .cpu() returns its input: it is the host's now
            if on_dev:
                self.dev[id(t)] = weakref.ref(t)
            else:
                self.dev.pop(id(t), None)
        return out


class Kernels(TorchDispatchMode):
    """aten ops that would launch a kernel (not views, not bare allocations), device and host apart."""

    def __init__(self, residency: Residency):
        super().__init__()
        self.residency = residency
        self.device, self.host = collections.Counter(), collections.Counter()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        # composite ops (linear, conv1d, ...) reach here whole under inference_mode, as their parts
        # under no_grad: run their C++ composite here, so both count the ops that run
        composite = torch._C.DispatchKey.CompositeImplicitAutograd
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), composite):
            with self:                   # the mode is off inside its handler: on again for the parts
                return func._op_dk(composite, *args, **kwargs)
        out = func(*args, **kwargs)
        schema = func._schema
        view = schema.returns and all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        name = func.overloadpacket.__name__
        if not view and name not in ("empty", "empty_strided", "empty_like", "detach", "lift_fresh"):
            (self.host if self.residency.host_call else self.device)[name] += 1
        return out


def count(model, call, label: str, top: int):
    call()                                               # warm (lazy inits, caches)
    res = Residency(model)
    kern = Kernels(res)
    with res, kern:
        call()
    t = []
    for _ in range(3):
        start = time.perf_counter()
        call()
        t.append(time.perf_counter() - start)
    print(f"\n== {label}: {sum(kern.device.values())} device kernels, {sum(res.syncs.values())} host syncs, "
          f"{sum(kern.host.values())} host ops; CPU wall {1e3 * min(t):.0f} ms (best of 3)")
    print("  top device ops: " + ", ".join(f"{k} {v}" for k, v in kern.device.most_common(top)))
    print("  host ops: " + ", ".join(f"{k} {v}" for k, v in kern.host.most_common(top)))
    for site, n in sorted(res.syncs.items()):
        print(f"  sync x{n}: {site}")
    return kern, res
