"""CTC greedy decoding: a segment's best token per frame -> its tokens and the frames each one spans.

Greedy CTC keeps one token per run of equal frames and drops the blank: "hh-e-ll-ll-o" (- blank)
-> h e l l o. The frames of each token's run give its time in the audio, so a CTC model's
transcript has segment and word times without any other alignment.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Tokens:
    ids: np.ndarray          # [K] token ids
    first: np.ndarray        # [K] first frame of each token's run
    last: np.ndarray         # [K] last frame (inclusive)

    def __len__(self) -> int:
        return int(self.ids.size)

    def select(self, keep: np.ndarray) -> "Tokens":
        return Tokens(self.ids[keep], self.first[keep], self.last[keep])

    @classmethod
    def concat(cls, parts: list["Tokens"]) -> "Tokens":
        if not parts:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("ids", "first", "last")))


def greedy(frame_ids: np.ndarray, blank: int) -> Tokens:
    """frame_ids [T] (argmax per frame) -> the collapsed tokens, blanks dropped, with their runs."""
    ids = np.asarray(frame_ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        return Tokens.concat([])
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], ids.size] - 1
    keep = ids[starts] != blank
    return Tokens(ids[starts][keep], starts[keep], ends[keep])
