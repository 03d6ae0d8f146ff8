"""Automatic prefix caching: full KV blocks found again by the tokens they hold.

A prompt's i-th full block is named by a hash of its tokens chained with the hash of block i - 1
(and, in the first, anything else that shapes the prompt's KV: `Sequence.cache_salt`), so equal
hashes mean equal prefixes. Blocks are reference-counted: a sequence holds each block of its table
once; a cached block whose count falls to 0 stays cached, in least-recently-released order, until a
fresh block is needed and none is free: then the oldest is evicted (forgotten and reused). A block
is never handed out, evicted or freed while a sequence holds it (`acquire` / `release` check it).

A prompt's full blocks are registered when its prefill step is launched: every later step runs after
it on the device's one stream, so a sequence that finds them reads the K/V that prefill writes.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque

import numpy as np


def block_hashes(tokens: list[int], block_size: int, salt: bytes = b"") -> list[bytes]:
    """The chained hashes of the full blocks of `tokens`."""
    ids = np.asarray(tokens, dtype=np.int64)
    out, parent = [], salt
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = hashlib.blake2b(parent + ids[start:start + block_size].tobytes(), digest_size=16).digest()
        out.append(parent)
    return out


class PrefixCache:
    """Block ownership: free blocks, reference counts, and the cached ones by hash."""

    def __init__(self, num_blocks: int):
        self.refs = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.by_hash: dict[bytes, int] = {}
        self.free: deque[int] = deque(range(num_blocks))               # never cached (or evicted)
        self.evictable: OrderedDict[int, None] = OrderedDict()          # cached, unreferenced, oldest first
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0

    def num_available(self) -> int:
        return len(self.free) + len(self.evictable)

    def match(self, hashes: list[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of `hashes` (not acquired)."""
        out = []
        for h in hashes:
            b = self.by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def acquire(self, block: int) -> None:
        if self.refs[block] == 0:
            if block not in self.evictable:
                raise AssertionError(f"block {block} acquired while neither cached nor held")
            del self.evictable[block]
        self.refs[block] += 1

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks, acquired: free ones first, then the least recently used cached ones."""
        if n > self.num_available():
            raise AssertionError(f"{n} blocks asked, {self.num_available()} available")
        out = []
        for _ in range(n):
            if self.free:
                b = self.free.popleft()
            else:
                b, _ = self.evictable.popitem(last=False)
                self.evictions += 1
                del self.by_hash[self.hash_of[b]]
                self.hash_of[b] = None
            if self.refs[b] != 0:
                raise AssertionError(f"block {b} handed out while held {self.refs[b]} times")
            self.refs[b] = 1
            out.append(b)
        return out

    def release(self, block: int) -> None:
        if self.refs[block] <= 0:
            raise AssertionError(f"block {block} released more often than acquired")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if self.hash_of[block] is not None:
                self.evictable[block] = None        # newest at the end
            else:
                self.free.append(block)

    def register(self, block: int, h: bytes) -> None:
        """`block` (held) holds the tokens hashed `h`; a block already cached under `h` stays the one."""
        if h in self.by_hash or self.hash_of[block] is not None:
            return
        self.by_hash[h] = block
        self.hash_of[block] = h

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
