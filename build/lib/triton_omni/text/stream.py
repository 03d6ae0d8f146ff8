"""Which generated tokens may be released to the detokenizer, and where a stop string ends a reply.

The AR step keeps one `TokenStream` per request. A token is released only when everything up to
it forms whole UTF-8 characters and no stop string could still begin inside it, so the stateless
detokenizer step never emits half a character and never emits the start of a stop string.
"""
from __future__ import annotations


def utf8_pending(data: bytes | bytearray) -> int:
    """How many trailing bytes begin a character that is not complete yet (0 when at a boundary).
    Invalid bytes count as complete: they decode to U+FFFD whatever follows."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:          # continuation byte: keep looking for the lead
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return back if back < need else 0
    return 0


class TokenStream:
    def __init__(self, token_bytes: list[bytes], stop: list[str]):
        self.token_bytes = token_bytes
        self.stops = [s.encode("utf-8") for s in stop]
        self.held: list[int] = []             # generated, not yet released
        self.held_bytes = bytearray()

    def push(self, new_ids: list[int]) -> tuple[list[int], str | None]:
        """Add tokens; returns (tokens to release now, the stop string hit or None).
        After a stop string, the released tokens contain it: the detokenizer cuts the text there."""
        for t in new_ids:
            self.held.append(t)
            self.held_bytes += self.token_bytes[t] if t < len(self.token_bytes) else b""
        for stop, raw in zip(self.stops, (s.decode("utf-8") for s in self.stops)):
            if stop in self.held_bytes:
                out, self.held, self.held_bytes = self.held, [], bytearray()
                return out, raw
        return self._release(self._must_hold()), None

    def flush(self) -> list[int]:
        out, self.held, self.held_bytes = self.held, [], bytearray()
        return out

    def _must_hold(self) -> int:
        """Trailing bytes that must stay held: an unfinished character or a possible stop prefix."""
        hold = utf8_pending(self.held_bytes)
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.held_bytes)), hold, -1):
                if self.held_bytes.endswith(stop[:k]):
                    hold = k
                    break
        return hold

    def _release(self, hold: int) -> list[int]:
        limit = len(self.held_bytes) - hold
        n, used, cut = 0, 0, 0
        for i, t in enumerate(self.held):
            used += len(self.token_bytes[t]) if t < len(self.token_bytes) else 0
            if used > limit:
                break
            if utf8_pending(self.held_bytes[:used]) == 0:
                n, cut = i + 1, used
        out = self.held[:n]
        self.held = self.held[n:]
        del self.held_bytes[:cut]
        return out
