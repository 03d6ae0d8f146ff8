"""Checks of token ids handed to a text encoder step (image and video models alike): host arrays only,
so a malformed tensor becomes InvalidInput naming it, never an index error (CPU) or a device-side
assert (GPU) that would fail the request's neighbours too."""
from __future__ import annotations

import numpy as np

from triton_omni.runtime.errors import InvalidInput


def check_ids(ids: np.ndarray, mask: np.ndarray, vocab: int, names=("text_ids", "text_mask")) -> None:
    """Token ids [rows, L] and their mask (host arrays): same shape, at least one token, ids in the vocabulary
    (an id past the embedding table is an index error on the CPU and a device-side assert on a GPU)."""
    if ids.shape != mask.shape:
        raise InvalidInput(names[1], f"shape {list(mask.shape)} differs from {names[0]}'s {list(ids.shape)}")
    if ids.size == 0 or not mask.any():
        raise InvalidInput(names[0], "no tokens")
    if ids.min() < 0 or ids.max() >= vocab:
        raise InvalidInput(names[0], f"ids must be between 0 and {vocab - 1} (the vocabulary), got "
                                     f"{int(ids.min())}..{int(ids.max())}")
    if mask.min() < 0 or mask.max() > 1:
        raise InvalidInput(names[1], "must hold only 0 and 1")
