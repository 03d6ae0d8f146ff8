"""A request's transcript from its segments' tokens: the text, segments with start/end times, words.

Each segment contributes the tokens of the audio it answers for (segment.py: overlapping windows
cut at the middle of their overlap). Times come from the tokens' frames. The text is the kept
tokens detokenized together (a window boundary inside a word does not split it); each output segment
is one input segment's tokens, detokenized on their own. The shapes follow OpenAI's verbose_json
(`segments`: id, seek, start, end, text, tokens, temperature, avg_logprob, compression_ratio,
no_speech_prob; `words`: word, start, end), which the proxy and the CLI render as json, text, srt, vtt.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from triton_omni.asr.ctc import Tokens
from triton_omni.asr.segment import RATE, Segment

WORD_START = ("▁", "Ġ")      # SentencePiece's and byte-level BPE's mark of a piece that starts a word


class Detokenizer:
    """Token ids -> text with a checkpoint's tokenizer (its fast backend: no CTC regrouping there)."""

    def __init__(self, tokenizer):
        self.backend = tokenizer.backend_tokenizer
        self.pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.special = set(tokenizer.all_special_ids)

    def __call__(self, ids) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=True).strip()

    def starts_word(self, token: int) -> bool:
        piece = self.pieces[token] if 0 <= token < len(self.pieces) else ""
        return bool(piece) and piece.startswith(WORD_START)


@dataclass
class Transcript:
    text: str = ""
    segments: list[dict] = field(default_factory=list)
    words: list[dict] = field(default_factory=list)


def compression_ratio(text: str) -> float:
    """Whisper's repetition signal: UTF-8 bytes over their zlib size."""
    data = text.encode("utf-8")
    return round(len(data) / len(zlib.compress(data)), 3) if data else 0.0


def kept(segment: Segment, tokens: Tokens, stride: int) -> Tokens:
    """The tokens whose middle frame lies in the audio this segment answers for."""
    middle = segment.start + (tokens.first + tokens.last + 1) * stride // 2
    return tokens.select((middle >= segment.keep_from) & (middle < segment.keep_to))


def assemble(segments: list[Segment], tokens: list[Tokens], logprobs: list[np.ndarray], stride: int,
             detok: Detokenizer, words: bool, temperature: float = 0.0) -> Transcript:
    """`tokens[i]`, `logprobs[i]` (each frame's best log-probability): segment i's greedy CTC output."""
    out = Transcript()
    parts, starts = [], []
    for seg, toks, lp in zip(segments, tokens, logprobs):
        toks = kept(seg, toks, stride)
        if not len(toks):
            continue
        parts.append(toks)
        starts.append(seg.start)
        text = detok(toks.ids)
        frames = np.concatenate([np.arange(a, b + 1) for a, b in zip(toks.first, toks.last)])
        out.segments.append({
            "id": len(out.segments), "seek": int(seg.start * 100 // RATE),
            "start": _time(seg.start + int(toks.first[0]) * stride), "end": _time(seg.start + (int(toks.last[-1]) + 1) * stride),
            "text": text, "tokens": toks.ids.tolist(), "temperature": temperature,
            "avg_logprob": round(float(lp[frames].mean()), 4) if lp.size else 0.0,
            "compression_ratio": compression_ratio(text), "no_speech_prob": 0.0})
    if not parts:
        return out
    out.text = detok(np.concatenate([p.ids for p in parts]))
    if words:
        out.words = word_times(parts, starts, stride, detok)
    return out


def word_times(parts: list[Tokens], starts: list[int], stride: int, detok: Detokenizer) -> list[dict]:
    """Words (a piece that starts a word opens the next) with the times of their first and last token."""
    found: list[dict] = []
    current: list[int] = []
    span = [0, 0]
    for toks, start in zip(parts, starts):
        for tid, a, b in zip(toks.ids.tolist(), toks.first.tolist(), toks.last.tolist()):
            if current and detok.starts_word(tid):
                _close(found, current, span, detok)
                current = []
            if not current:
                span[0] = start + a * stride
            current.append(tid)
            span[1] = start + (b + 1) * stride
    if current:
        _close(found, current, span, detok)
    return found


def _close(found: list[dict], ids: list[int], span: list[int], detok: Detokenizer) -> None:
    word = detok(ids)
    if word:
        found.append({"word": word, "start": _time(span[0]), "end": _time(span[1])})


def _time(sample: int) -> float:
    return round(sample / RATE, 3)
