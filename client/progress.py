"""Progress bars (tqdm) for the long commands: setup steps, tiny checkpoints, repository generation,
waiting for the server, benchmarks, the CLI's long calls. Shown only to a person: quiet when stderr is
not a terminal or when CI is set, so logs and CI output stay clean."""
from __future__ import annotations

import os
import sys


def shown() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def bar(iterable=None, total: int | None = None, desc: str = "", unit: str = "it"):
    """A tqdm bar over `iterable` (or one updated by hand, of `total`), disabled when not shown."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not shown(), leave=False, dynamic_ncols=True)
