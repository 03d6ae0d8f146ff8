"""Long audio in pieces a model takes: each piece within the model's own input limit, all of them
together covering the speech once.

Two ways, chosen per served model (the pre step's `segmentation` parameter):
- `vad`: Silero VAD finds the speech (asr/vad.py); the speech regions are packed, in order, into
  segments of at most `max_segment_s` (a pause of at most `max_gap_s` inside a segment stays in it,
  as context; a longer silence ends the segment, so silence costs no encoder time); a region longer
  than `max_segment_s` is cut into overlapping windows. Audio without speech has no segment (an empty
  transcript). A clip of at most `max_segment_s` with speech in it stays whole: the model sees what it
  would see without segmentation.
- `window`: fixed windows of `max_segment_s` overlapping by `overlap_s`, over the whole clip.

Overlapping windows each transcribe the overlap; `Segment.keep_from` / `keep_to` say which part of
the audio each window answers for (cut in the middle of each overlap), so a CTC token is kept by the
one window whose part holds its frame (asr/ctc.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RATE = 16000


@dataclass(frozen=True)
class Segment:
    start: int          # first sample, in the request's audio
    length: int         # samples
    keep_from: int      # the samples of the audio whose tokens this segment gives (absolute)
    keep_to: int

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class SegmentSettings:
    max_segment_s: float = 30.0
    overlap_s: float = 2.0
    min_segment_s: float = 0.1       # pieces shorter than this are left out (or joined to a neighbour)
    max_gap_s: float = 1.0           # a longer silence between speech regions starts a new segment


def windows(start: int, end: int, s: SegmentSettings) -> list[Segment]:
    """[start, end) as windows of at most max_segment_s overlapping by overlap_s, each answering for
    the audio up to the middle of its overlaps."""
    size, overlap = int(s.max_segment_s * RATE), int(s.overlap_s * RATE)
    if end - start <= size:
        return [Segment(start, end - start, start, end)]
    step = size - overlap
    count = -(-(end - start - overlap) // step)
    step = -(-(end - start - overlap) // count)          # equal steps: no short last window
    out = []
    for i in range(count):
        a = start + i * step
        b = min(a + size, end) if i + 1 < count else end
        out.append(Segment(a, b - a, start if i == 0 else a + overlap // 2, end if i + 1 == count else a + step + overlap // 2))
    return out


def pack_regions(regions: list[tuple[int, int]], samples: int, s: SegmentSettings) -> list[Segment]:
    """Speech regions -> segments of at most max_segment_s (regions at most max_gap_s apart share one), in
    order; each answers for the audio up to the middle of the silence before the next one."""
    size, least, gap = int(s.max_segment_s * RATE), int(s.min_segment_s * RATE), int(s.max_gap_s * RATE)
    spans: list[list[int]] = []
    for a, b in regions:
        if b - a < least:
            continue
        if spans and b - spans[-1][0] <= size and a - spans[-1][1] <= gap:
            spans[-1][1] = b
        else:
            spans.append([a, b])
    out: list[Segment] = []
    for i, (a, b) in enumerate(spans):
        lo = 0 if i == 0 else (spans[i - 1][1] + a) // 2
        hi = samples if i + 1 == len(spans) else (b + spans[i + 1][0]) // 2
        pieces = windows(a, b, s)
        pieces[0] = Segment(pieces[0].start, pieces[0].length, lo, pieces[0].keep_to if len(pieces) > 1 else hi)
        if len(pieces) > 1:
            pieces[-1] = Segment(pieces[-1].start, pieces[-1].length, pieces[-1].keep_from, hi)
        out += pieces
    return out


def plan(wave: np.ndarray, method: str, s: SegmentSettings, vad=None, vad_settings=None) -> list[Segment]:
    """The segments of a 16 kHz clip. `vad`: a SileroVAD (asr/vad.py) for method 'vad'."""
    n = int(wave.size)
    if method == "window":
        return windows(0, n, s)
    if method != "vad":
        raise ValueError(f"segmentation {method!r}: expected 'vad' or 'window'")
    import torch

    from triton_omni.asr.vad import VADSettings, speech_regions

    regions = speech_regions(vad.probabilities(torch.from_numpy(wave)), n, vad_settings or VADSettings())
    if not regions:
        return []
    if n <= s.max_segment_s * RATE:
        return [Segment(0, n, 0, n)]
    return pack_regions(regions, n, s)


def as_array(segments: list[Segment]) -> np.ndarray:
    """[N, 4] int64: start, length, keep_from, keep_to (the tensor the steps pass on)."""
    return np.asarray([[g.start, g.length, g.keep_from, g.keep_to] for g in segments], dtype=np.int64).reshape(-1, 4)


def from_array(rows: np.ndarray) -> list[Segment]:
    return [Segment(*map(int, r)) for r in np.asarray(rows).reshape(-1, 4)]
