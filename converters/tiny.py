"""Tiny random checkpoints in the real Hugging Face layouts, for the demo and the tests.

Each is written by the reference implementation itself (`save_pretrained` of the transformers
class), so the files have the real parameter names and config keys that a downloaded checkpoint
has. Weights are random (seeded): the models load and run like the real ones but say nothing.

This module is the entry point (which builders exist, building and reusing folders); the builders
live in converters/tiny_*.py and share converters/tiny_common.py.
"""
from __future__ import annotations

import hashlib
import inspect
import shutil
import sys
from pathlib import Path

from triton_omni.converters import tiny_common

VERSION = "1"        # bump when a checkpoint's content changes, so old folders are rebuilt


def builders() -> dict:
    """name -> builder(out folder). Imported here, on demand: each builder module needs its own libraries."""
    from triton_omni.converters.tiny_asr import BUILDERS as ASR
    from triton_omni.converters.tiny_bagel import BUILDERS as BAGEL
    from triton_omni.converters.tiny_chat import BUILDERS as CHAT
    from triton_omni.converters.tiny_chatterbox import BUILDERS as CHATTERBOX
    from triton_omni.converters.tiny_fish import BUILDERS as FISH
    from triton_omni.converters.tiny_higgs import BUILDERS as HIGGS
    from triton_omni.converters.tiny_image import BUILDERS as IMAGE
    from triton_omni.converters.tiny_joyimage import BUILDERS as JOYIMAGE
    from triton_omni.converters.tiny_moe import BUILDERS as MOE
    from triton_omni.converters.tiny_omni import BUILDERS as OMNI
    from triton_omni.converters.tiny_omnivoice import BUILDERS as OMNIVOICE
    from triton_omni.converters.tiny_qwen3_tts import BUILDERS as QWEN3_TTS
    from triton_omni.converters.tiny_tts import BUILDERS as TTS
    from triton_omni.converters.tiny_video import BUILDERS as VIDEO
    from triton_omni.converters.tiny_vision import BUILDERS as VISION

    return {**CHAT, **MOE, **TTS, **QWEN3_TTS, **IMAGE, **JOYIMAGE, **OMNIVOICE, **CHATTERBOX, **FISH, **BAGEL, **ASR,
            **VIDEO, **VISION, **HIGGS, **OMNI}


def _stamp(builder) -> str:
    """Changes whenever the module that defines the builder, or the helpers it shares, changes: its
    checkpoints are rebuilt."""
    source = "".join(inspect.getsource(sys.modules[m]) for m in (builder.__module__, tiny_common.__name__))
    return VERSION + "-" + hashlib.sha1(source.encode()).hexdigest()[:12]


def build(root: str | Path, names: list[str] | None = None) -> dict[str, Path]:
    """Build (or reuse) tiny checkpoints under root/<name>; returns name -> folder."""
    root = Path(root)
    from triton_omni.client.progress import bar

    table = builders()
    done = {}
    for name in (steps := bar(names or list(table), desc="tiny checkpoints", unit="checkpoint")):
        steps.set_postfix_str(name)
        out = root / name
        stamp = out / ".tiny-version"
        if not (stamp.exists() and stamp.read_text() == _stamp(table[name])):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            table[name](out)
            stamp.write_text(_stamp(table[name]))
        done[name] = out
    return done
