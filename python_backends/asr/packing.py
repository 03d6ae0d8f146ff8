"""Every request's segments as one list of clips for an audio encoder, and that list cut into forwards
of a bounded size (so a long request, or many at once, never holds more activations than the budget).

`clips_of` checks the pre step's tensors wherever they come from (any step can be called directly).
"""
from __future__ import annotations

import numpy as np

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request


def host(value) -> np.ndarray:
    """An input as numpy (a GPU step may be handed a torch tensor on the device)."""
    return value.cpu().numpy() if hasattr(value, "cpu") else np.asarray(value)


def clips_of(req: Request, min_samples: int, max_samples: int) -> list[np.ndarray]:
    """A request's clips from `samples` [S] and `segment_spans` [N, 4] (start, length, keep_from, keep_to)."""
    samples = host(req.get("samples")).astype(np.float32, copy=False).reshape(-1)
    spans = host(req.get("segment_spans")).reshape(-1, 4)
    lengths = spans[:, 1].astype(np.int64)
    if int(lengths.sum()) != samples.size:
        raise InvalidInput("segment_spans", f"the segment lengths add up to {int(lengths.sum())}; samples has {samples.size}")
    if lengths.size and (lengths.min() < min_samples or lengths.max() > max_samples):
        raise InvalidInput("segment_spans", f"each segment has {min_samples} to {max_samples} samples (the model's "
                                            f"input limit); got {int(lengths.min())} to {int(lengths.max())}")
    if (spans[:, 0] < 0).any() or (spans[:, 2] > spans[:, 3]).any():
        raise InvalidInput("segment_spans", "starts must be >= 0 and keep_from <= keep_to")
    if not np.isfinite(samples).all():
        raise InvalidInput("samples", "has values that are not finite numbers")
    bounds = np.cumsum([0, *lengths.tolist()])
    return [samples[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


# moved to encoders/batching.py (shared with the omni family); importers here keep it
from triton_omni.encoders.batching import forward_groups  # noqa: E402,F401
