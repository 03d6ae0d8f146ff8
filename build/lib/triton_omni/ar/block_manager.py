"""Paged KV-cache blocks and per-sequence slots, handed out from free lists.

A sequence reserves, on admission, every block it can ever need (prompt + max_tokens), so a
running sequence never waits for memory and nothing has to be preempted; blocks need not be
contiguous, so freed blocks are reused whatever their position (no fragmentation).
"""
from __future__ import annotations

from collections import deque

from triton_omni.ar.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, num_slots: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.free_slots: deque[int] = deque(range(num_slots))

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_admit(self, seq: Sequence) -> bool:
        return bool(self.free_slots) and len(self.free_blocks) >= self.blocks_needed(seq.max_total_tokens)

    def admit(self, seq: Sequence) -> None:
        n = self.blocks_needed(seq.max_total_tokens)
        seq.block_table = [self.free_blocks.popleft() for _ in range(n)]
        seq.row = self.free_slots.popleft()
        seq.state_slot = seq.row

    def release(self, seq: Sequence) -> None:
        self.free_blocks.extend(seq.block_table)
        seq.block_table = []
        if seq.row >= 0:
            self.free_slots.append(seq.row)
        seq.row = seq.state_slot = -1
