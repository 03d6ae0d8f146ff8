"""Moving step inputs onto the step's device and outputs back to Triton, and grouping a batch."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Hashable, Iterable, TypeVar

import numpy as np
import torch

T = TypeVar("T")


def to_torch(value: Any, device: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A Triton input (numpy on CPU, torch via DLPack on GPU) as a torch tensor on `device`."""
    t = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
    return t.to(device=device, dtype=dtype) if dtype is not None else t.to(device)


def to_output(t: torch.Tensor) -> Any:
    """CPU tensors leave as numpy; GPU tensors stay on the GPU (the adapter hands them over by DLPack)."""
    t = t.detach().contiguous()
    return t.numpy() if t.device.type == "cpu" else t


def group_by(items: Iterable[T], key: Callable[[T], Hashable]) -> dict[Hashable, list[T]]:
    """Items that can share one batched model call, in arrival order."""
    groups: dict[Hashable, list[T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(groups)
