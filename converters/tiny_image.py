"""Tiny random checkpoints for the image models (see converters/tiny.py)."""
from __future__ import annotations

BUILDERS: dict = {}     # name -> builder(out: Path) writing a checkpoint folder
