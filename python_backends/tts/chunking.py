"""When streamed audio is cut, and which codec frames each cut decodes.

A talker emits codec frames one after another; the codec turns them into audio chunk by chunk.
Chunk boundaries are fixed in frames: a small first chunk (low latency), then equal larger ones.
A chunk [s, e) is decoded as the window [s - left, e + right) and only its own samples are kept:
`left`/`right` cover the decoder's receptive field, so every kept sample equals the same sample of
a whole-utterance decode and chunk boundaries cannot click. A chunk is therefore ready once frame
e + right exists; at the end of the utterance the rest is one last chunk.

Everything is a pure function of frame counts, so the streamed path (many small steps) and the
non-streamed path (one step with every frame) cut the same chunks and decode the same windows:
concatenated streamed audio equals the non-streamed audio.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkPlan:
    first: int          # frames in the first chunk
    size: int           # frames in every later chunk
    left: int           # context frames decoded before a chunk
    right: int          # lookahead frames decoded after a chunk

    def __post_init__(self) -> None:
        if self.first < 1 or self.size < 1 or self.left < 0 or self.right < 0:
            raise ValueError(f"invalid chunk plan {self}")

    def ready_end(self, frames: int) -> int:
        """Where the audio that can be emitted with `frames` frames known ends (a boundary)."""
        if frames < self.first + self.right:
            return 0
        return self.first + (frames - self.right - self.first) // self.size * self.size

    def next_boundary(self, b: int) -> int:
        return self.first if b < self.first else b + self.size

    def chunks(self, before: int, now: int, final: bool) -> list[tuple[int, int]]:
        """The chunks [start, end) to emit when the frames known grow from `before` to `now`
        (`final`: the utterance ends at `now`)."""
        b, end = self.ready_end(before), self.ready_end(now)
        out = []
        while b < end:
            out.append((b, self.next_boundary(b)))
            b = out[-1][1]
        if final and b < now:
            out.append((b, now))
        return out

    def window(self, chunk: tuple[int, int], now: int) -> tuple[int, int]:
        """The frames decoded for a chunk: its receptive field, clipped to the utterance (a ready
        chunk's lookahead always exists; the last chunk ends at the last frame)."""
        start, end = chunk
        return max(0, start - self.left), min(end + self.right, now)

    def context_start(self, before: int) -> int:
        """The first frame the next emission can need, given `before` frames were known."""
        return max(0, self.ready_end(before) - self.left)
