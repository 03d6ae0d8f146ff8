"""Moving step inputs onto the step's device and outputs back to Triton, grouping a batch, and the
pipelines' rounding of decoded pixels."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Hashable, Iterable, TypeVar

import numpy as np
import torch

T = TypeVar("T")


def to_torch(value: Any, device: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A Triton input (numpy on CPU, torch via DLPack on GPU) as a torch tensor on `device`."""
    if not isinstance(value, torch.Tensor):
        value = np.ascontiguousarray(value)
        # torch shares a numpy array's memory and may write to it: a read-only input gets its own copy
        value = torch.from_numpy(value if value.flags.writeable else value.copy())
    t = value
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


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    """VAE output in [-1, 1], [B, 3, H, W] -> [B, H, W, 3] uint8, as `VaeImageProcessor.postprocess`
    and `numpy_to_pil` do it: (x * 0.5 + 0.5) clamped to [0, 1], times 255, rounded."""
    image = (image * 0.5 + 0.5).clamp(0, 1)
    return (image.permute(0, 2, 3, 1).float() * 255).round().to(torch.uint8)
