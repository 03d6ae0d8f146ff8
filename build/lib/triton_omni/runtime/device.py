"""Host -> device copies that do not wait for the GPU."""
from __future__ import annotations

import torch


def upload(values, device: torch.device | str, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """`values` (a list, an array or a tensor) as a `dtype` tensor on `device`, without waiting for the
    GPU. A copy from pageable host memory first waits for every kernel already queued on the stream
    (in a server: the AR engine's step in flight, milliseconds); one from pinned memory does not
    (torch's pinned-memory cache keeps the buffer until the copy has run)."""
    if isinstance(values, torch.Tensor) and values.device.type != "cpu":
        return values.to(device, dtype)
    host = torch.as_tensor(values, dtype=dtype)
    return host.pin_memory().to(device, non_blocking=True) if torch.device(device).type == "cuda" else host.to(device)
