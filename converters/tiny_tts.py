"""Tiny random checkpoints for the speech models (see converters/tiny.py)."""
from __future__ import annotations

BUILDERS: dict = {}     # name -> builder(out: Path) writing a checkpoint folder
