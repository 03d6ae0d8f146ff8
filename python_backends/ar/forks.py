"""n > 1: the request's other samples as forks of its first.

A fork is a sequence of its own (row, output, stop state) whose prompt is its parent's: the
scheduler admits the group together, only the parent's prompt is prefilled, and every sample's
first token is drawn from that one prefill's last hidden state. A fork shares the parent's full
prompt blocks (reference-counted), gets a copy of the partial last one and of the recurrent state
(models with linear-attention layers), and its own seed: derived from the request's and its index,
so a seeded request of n samples is reproducible and its samples differ.
"""
from __future__ import annotations

import dataclasses

from triton_omni.ar.sequence import Sequence

_MASK64 = (1 << 64) - 1


def fork_seed(seed: int, index: int) -> int:
    """Sample `index`'s seed (index 0 keeps the request's): a 64-bit mix, as a signed int64."""
    if index == 0:
        return seed
    x = (seed ^ (index * 0x9E3779B97F4A7C15)) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x - (1 << 64) if x >= 1 << 63 else x


def make_forks(seq: Sequence) -> list[Sequence]:
    """The n - 1 forks of a request's first sequence (sharing its callback)."""
    forks = []
    for i in range(1, seq.params.n):
        params = dataclasses.replace(seq.params, seed=fork_seed(seq.params.seed, i))
        fork = Sequence(seq.prompt_ids, params, seq.on_output, index=i, parent=seq, arrival=seq.arrival,
                        thinking=seq.thinking, thinking_left=seq.thinking_left)
        if seq.matcher is not None:
            fork.matcher = seq.matcher.fork()
        forks.append(fork)
    return forks
