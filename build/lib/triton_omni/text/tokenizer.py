"""Tokenizers from a checkpoint folder, and the raw bytes each token stands for.

The byte table lets the AR step cut a token stream only at whole UTF-8 characters and match stop
strings exactly, without decoding text itself: byte-level BPE tokens map to bytes through the
GPT-2 byte alphabet, SentencePiece pieces through `▁` -> space and `<0xNN>` byte-fallback tokens.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path


def load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted: char -> byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def token_byte_table(tokenizer) -> list[bytes]:
    """bytes[i] = what token i contributes to the text (special tokens contribute nothing)."""
    backend = tokenizer.backend_tokenizer
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    decoder_types = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
    byte_level = "ByteLevel" in decoder_types
    alphabet = _byte_alphabet()
    special = set(tokenizer.all_special_ids)
    added = {tid: tok for tid, tok in tokenizer.added_tokens_decoder.items()}
    size = max(len(tokenizer), max(added, default=-1) + 1)
    table: list[bytes] = [b""] * size
    for piece, tid in backend.get_vocab(with_added_tokens=False).items():
        if byte_level:
            table[tid] = bytes(alphabet.get(c, 0) for c in piece)
        elif (m := _BYTE_FALLBACK.match(piece)) is not None:
            table[tid] = bytes([int(m.group(1), 16)])
        else:
            table[tid] = piece.replace("▁", " ").encode("utf-8")
    for tid, tok in added.items():
        table[tid] = b"" if (tid in special or tok.special) else tok.content.encode("utf-8")
    return table
