"""Decides each step: prefill newly admitted prompts (packed together), else decode every running
sequence that still has tokens to sample. Sequences join at prefill and leave when finished:
continuous batching. A request of n > 1 samples is admitted whole: its forks run beside it from
the first token on, sampled from the one prefill of its prompt."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from triton_omni.ar.block_manager import BlockManager
from triton_omni.ar.sequence import Sequence, Status


@dataclass
class Batch:
    is_prefill: bool
    seqs: list[Sequence]


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def prefill_is_full(self) -> bool:
        """Whether the waiting prompts already fill a prefill step (sequences or tokens)."""
        return (len(self.running) + sum(1 + len(s.forks) for s in self.waiting) >= self.max_num_seqs
                or sum(s.prompt_len for s in self.waiting) >= self.max_num_batched_tokens)

    def schedule(self, prefill: bool = True) -> Batch | None:
        """The next step; `prefill=False`: leave the waiting prompts waiting (decode, if any runs)."""
        admitted, tokens = [], 0
        while prefill and self.waiting:
            seq = self.waiting[0]
            n = seq.prompt_len
            if len(self.running) + len(admitted) + 1 + len(seq.forks) > self.max_num_seqs:
                break
            if admitted and tokens + n > self.max_num_batched_tokens:
                break
            if not self.blocks.can_admit(seq):
                break
            self.waiting.popleft()
            self.blocks.admit(seq)
            for s in (seq, *seq.forks):
                s.status = Status.RUNNING
                admitted.append(s)
            tokens += n
        if admitted:
            self.running.extend(admitted)
            return Batch(True, admitted)
        # a sequence whose last token is already launched waits (unscheduled) for its results
        decodable = [s for s in self.running if s.num_launched < s.params.max_tokens]
        return Batch(False, decodable) if decodable else None

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is Status.FINISHED:
            return
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.blocks.release(seq)
        elif seq.parent is None:            # a waiting fork leaves with its parent (never alone)
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
