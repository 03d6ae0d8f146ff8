"""Combining the result files of separate benchmark runs (a run split in parts to fit a time limit)."""
from __future__ import annotations

import json
from pathlib import Path


def merge_parts(paths: list[Path], key: tuple[str, ...], notes: list[str] | None = None):
    """The parsed files, their rows (a later file's row replaces an earlier one with the same `key`
    fields; each row keeps the command that made it) and their notes followed by `notes`, each once."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    rows: dict[tuple, dict] = {}
    for part in parts:
        for r in part["results"]:
            if part.get("command") or part.get("commands"):
                r.setdefault("command", part.get("command") or part["commands"][0])
            k = tuple(r[f] for f in key)
            rows.pop(k, None)
            rows[k] = r
    merged_notes = list(dict.fromkeys([n for p in parts for n in p.get("notes", [])] + list(notes or [])))
    return parts, list(rows.values()), merged_notes
