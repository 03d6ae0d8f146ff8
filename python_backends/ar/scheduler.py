"""Decides each step: prefill newly admitted prompts (packed together), else decode every running
sequence that still has tokens to sample. Sequences join at prefill and leave when finished:
continuous batching. Prompts that arrive one by one while others decode are held for a few decode
steps, so that several share one prefill step (EngineConfig.max_prefill_delay_steps)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from python_backends.ar.block_manager import BlockManager
from python_backends.ar.sequence import Sequence, Status


@dataclass
class Batch:
    is_prefill: bool
    seqs: list[Sequence]


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefill_delay_steps: int = 0, prefill_batch_fraction: float = 0.0):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefill_delay_steps = max_prefill_delay_steps
        self.prefill_batch_fraction = prefill_batch_fraction
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.decode_steps = 0
        self._waiting_since = 0          # decode step count when the oldest waiting prompt arrived

    def add(self, seq: Sequence) -> None:
        if not self.waiting:
            self._waiting_since = self.decode_steps
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _hold_prompts(self, decodable: list[Sequence]) -> bool:
        """Whether the waiting prompts should wait another decode step for company."""
        if not decodable or self.max_prefill_delay_steps <= 0:
            return False
        if self.decode_steps - self._waiting_since >= self.max_prefill_delay_steps:
            return False
        room = self.max_num_seqs - len(self.running)
        enough = max(1.0, self.prefill_batch_fraction * len(self.running))
        return len(self.waiting) < min(enough, room)

    def schedule(self) -> Batch | None:
        # a sequence whose last token is already launched waits (unscheduled) for its results
        decodable = [s for s in self.running if s.num_launched < s.params.max_tokens]
        if self.waiting and self._hold_prompts(decodable):
            self.decode_steps += 1
            return Batch(False, decodable)
        admitted, tokens = [], 0
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            seq = self.waiting[0]
            n = seq.prompt_len
            if admitted and tokens + n > self.max_num_batched_tokens:
                break
            if not self.blocks.can_admit(seq):
                break
            self.waiting.popleft()
            self.blocks.admit(seq)
            seq.status = Status.RUNNING
            admitted.append(seq)
            tokens += n
        if admitted:
            self.running.extend(admitted)
            self._waiting_since = self.decode_steps      # those left waiting start a new wait
            return Batch(True, admitted)
        if decodable:
            self.decode_steps += 1
            return Batch(False, decodable)
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is Status.FINISHED:
            return
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.blocks.release(seq)
        else:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
