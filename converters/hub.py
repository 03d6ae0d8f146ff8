"""Checkpoints named by their Hugging Face repository: `--checkpoint NAME=hf:ORG/REPO[@REVISION]`.

The converter fetches the repository's files through huggingface_hub's snapshot API into the local
hub cache ($HF_HOME/hub, or $HF_HUB_CACHE), once, and serves the snapshot folder: the model steps only
ever read that local folder (nothing downloads while serving). With HF_HUB_OFFLINE=1 (or no network)
the cache alone answers. Only the files a model loads are fetched: its YAML's `hub.allow_patterns`,
else DEFAULT_PATTERNS (weights, configs, tokenizer files; not the .bin/.pth/.onnx copies repos carry).
"""
from __future__ import annotations

import os

PREFIX = "hf:"
DEFAULT_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py", "*.yaml",
                    "**/*.json", "**/*.safetensors", "**/*.txt", "**/*.model", "**/*.tiktoken", "**/*.jinja"]


def is_hub(value: str) -> bool:
    return value.startswith(PREFIX)


def parse(value: str) -> tuple[str, str | None]:
    """`hf:ORG/REPO[@REVISION]` -> (ORG/REPO, REVISION or None)."""
    spec = value[len(PREFIX):]
    repo, _, revision = spec.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or (_ and not revision):
        raise ValueError(f"expected hf:ORG/REPO or hf:ORG/REPO@REVISION, got {value!r}")
    return repo, revision or None


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def cache_dir() -> str | None:
    """The hub cache as the environment says now ($HF_HUB_CACHE, else $HF_HOME/hub; None: the library's
    default), read at each call rather than when huggingface_hub was imported."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    return os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None


def snapshot(value: str, allow_patterns: list[str] | None = None) -> str:
    """The local snapshot folder of `hf:ORG/REPO[@REVISION]`, fetched into the hub cache if missing
    (from the cache alone when offline). SystemExit with the repository and the reason otherwise."""
    from huggingface_hub import snapshot_download

    repo, revision = parse(value)
    try:
        return snapshot_download(repo, revision=revision, allow_patterns=allow_patterns or DEFAULT_PATTERNS,
                                 cache_dir=cache_dir(), local_files_only=offline())
    except Exception as e:  # noqa: BLE001 - the hub's errors are many; the user needs the repo and the reason
        where = "in the local hub cache (offline)" if offline() else "on the hub or in the local cache"
        raise SystemExit(f"error: checkpoint {value}: not found {where}: {type(e).__name__}: {e}") from None
