"""A checkpoint's own sampling defaults: its generation_config.json, as vLLM applies it.

Qwen3's release ships temperature 0.6, top_p 0.95, top_k 20 (thinking); a request that sets a field
overrides it, one that leaves it out gets the checkpoint's value rather than ours. Its EOS ids are
read by the AR step (ar/step.py's eos_token_ids).
"""
from __future__ import annotations

import json
from pathlib import Path

from triton_omni.ar.sampling import SamplingParams

FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def generation_defaults(folder: str | Path) -> SamplingParams:
    """SamplingParams whose defaults are the checkpoint's (ours where it says nothing)."""
    path = Path(folder) / "generation_config.json"
    raw = json.loads(path.read_text()) if path.exists() else {}
    known = {k: raw[k] for k in FIELDS if raw.get(k) is not None}
    # checked as a request's would be: a broken config fails the step's start, naming the field
    return SamplingParams.from_dict(known)
