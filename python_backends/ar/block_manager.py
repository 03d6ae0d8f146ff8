"""Paged KV-cache blocks and per-sequence slots.

A sequence reserves, on admission, every block it can ever need (prompt + max_tokens), so a
running sequence never waits for memory and nothing has to be preempted; blocks need not be
contiguous, so freed blocks are reused whatever their position (no fragmentation).

With prefix caching (ar/prefix_cache.py), the prompt's leading full blocks that are cached are
shared instead of allocated (`Sequence.num_cached` tokens, never prefilled again; at least the
prompt's last token is always prefilled, for its logits). The forks of an n > 1 request share all
of its parent's full prompt blocks; the partial last one is copied for each (`fork_copies`).
"""
from __future__ import annotations

from collections import deque

from triton_omni.ar.prefix_cache import PrefixCache, block_hashes
from triton_omni.ar.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, num_slots: int, prefix_caching: bool = False):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self.cache = PrefixCache(num_blocks)
        self.free_slots: deque[int] = deque(range(num_slots))
        self.fork_copies: list[tuple[int, int]] = []       # (source, destination) blocks of the last admissions

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _hits(self, seq: Sequence) -> list[int]:
        if not self.prefix_caching or not seq.prompt_ids:
            return []
        if seq.block_hashes is None:
            seq.block_hashes = block_hashes(seq.prompt_ids, self.block_size, seq.cache_salt)
        usable = (seq.prompt_len - 1) // self.block_size        # keep the last prompt token to prefill
        return self.cache.match(seq.block_hashes[:usable])

    def can_admit(self, seq: Sequence) -> bool:
        group = [seq, *seq.forks]
        if len(self.free_slots) < len(group):
            return False
        hits = self._hits(seq)
        held = sum(1 for b in hits if self.cache.refs[b] == 0)     # acquiring these takes them off the evictable list
        shared = seq.prompt_len // self.block_size                  # a fork's blocks shared with its parent
        total = self.blocks_needed(seq.max_total_tokens)
        need = total - len(hits) + len(seq.forks) * (total - shared)
        return self.cache.num_available() - held >= need

    def admit(self, seq: Sequence) -> None:
        """Blocks and a slot for `seq` and its forks (checked with can_admit first)."""
        hits = self._hits(seq)
        for b in hits:
            self.cache.acquire(b)
        total = self.blocks_needed(seq.max_total_tokens)
        seq.block_table = hits + self.cache.allocate(total - len(hits))
        seq.num_cached = len(hits) * self.block_size
        self.cache.queried_tokens += seq.prompt_len
        self.cache.hit_tokens += seq.num_cached
        self._take_slot(seq)
        shared = seq.prompt_len // self.block_size
        for fork in seq.forks:
            for b in seq.block_table[:shared]:
                self.cache.acquire(b)
            fork.block_table = seq.block_table[:shared] + self.cache.allocate(total - shared)
            if seq.prompt_len % self.block_size:       # the partial block the fork writes its own tokens into
                self.fork_copies.append((seq.block_table[shared], fork.block_table[shared]))
            self._take_slot(fork)

    def _take_slot(self, seq: Sequence) -> None:
        seq.row = self.free_slots.popleft()
        seq.state_slot = seq.row

    def register_prompt(self, seq: Sequence) -> None:
        """Cache the prompt's full blocks (called when its prefill is launched)."""
        if not self.prefix_caching or not seq.prompt_ids:
            return
        if seq.block_hashes is None:
            seq.block_hashes = block_hashes(seq.prompt_ids, self.block_size, seq.cache_salt)
        for b, h in zip(seq.block_table, seq.block_hashes):
            self.cache.register(b, h)

    def release(self, seq: Sequence) -> None:
        for b in seq.block_table:
            self.cache.release(b)
        seq.block_table = []
        if seq.row >= 0:
            self.free_slots.append(seq.row)
        seq.row = seq.state_slot = -1

    @property
    def free_blocks(self) -> list[int]:
        """Blocks a new sequence may take: free ones and cached unreferenced ones."""
        return [*self.cache.free, *self.cache.evictable]
