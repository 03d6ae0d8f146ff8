"""`triton-omni build --checkpoint NAME=hf:ORG/REPO[@REV]`, offline, against a hub cache laid out
as huggingface_hub lays it (blobs named by their hash, snapshots of symlinks, refs naming commits),
built here from the tiny Qwen3 checkpoint."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from triton_omni.converters.__main__ import main
from triton_omni.converters import hub

REPO = "Qwen/Qwen3-0.6B"


def add_snapshot(cache: Path, repo: str, source: Path, commit: str, ref: str | None) -> Path:
    """`source`'s files as the snapshot `commit` of `repo` in the hub cache (and `ref` naming it)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    for f in sorted(p for p in source.rglob("*") if p.is_file() and not p.name.startswith(".")):
        data = f.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snap / f.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        up = len(f.relative_to(source).parts) - 1          # from the link's folder back to the snapshot
        link.symlink_to(Path(*([".."] * (up + 2)), "blobs", blob.name))
    if ref is not None:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def offline_cache(tmp_path, monkeypatch, tiny_checkpoints):
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = home / "hub"
    main_snap = add_snapshot(cache, REPO, tiny_checkpoints["qwen3"], "a" * 40, "main")
    tagged = add_snapshot(cache, REPO, tiny_checkpoints["qwen3"], "b" * 40, "v1")
    return main_snap, tagged


def built_checkpoint(out: Path) -> str:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = text_format.Parse((out / "qwen3_chat_ar" / "config.pbtxt").read_text(), mc.ModelConfig())
    return cfg.parameters["checkpoint"].string_value


def test_hf_checkpoint_resolves_from_the_offline_cache(offline_cache, tmp_path):
    main_snap, tagged = offline_cache
    out = tmp_path / "repo"
    # the build verifies the folder it resolved (config, weights, tokenizer): a real, loadable checkpoint
    assert main(["build", "--models", "qwen3_chat", "--checkpoint", f"qwen3_chat=hf:{REPO}", "--out", str(out)]) == 0
    assert built_checkpoint(out) == str(main_snap)
    assert (main_snap / "config.json").resolve().parent.name == "blobs"
    for rev, want in (("v1", tagged), ("b" * 40, tagged)):
        assert main(["build", "--models", "qwen3_chat", "--checkpoint", f"qwen3_chat=hf:{REPO}@{rev}",
                     "--out", str(out)]) == 0
        assert built_checkpoint(out) == str(want)


def test_hf_checkpoint_errors_name_the_repository(offline_cache, tmp_path):
    with pytest.raises(SystemExit, match="Qwen/Qwen3-404B: not found in the local hub cache"):
        main(["build", "--models", "qwen3_chat", "--checkpoint", "qwen3_chat=hf:Qwen/Qwen3-404B",
              "--out", str(tmp_path / "repo")])
    with pytest.raises(SystemExit, match="hf:ORG/REPO"):
        main(["build", "--models", "qwen3_chat", "--checkpoint", "qwen3_chat=hf:not-a-repo", "--out", str(tmp_path / "r")])
    assert hub.parse("hf:a/b@main") == ("a/b", "main") and hub.parse("hf:a/b") == ("a/b", None)


def test_readme_lists_each_models_released_checkpoints():
    import yaml

    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    for path in sorted((ROOT / "ensemble_configs").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        assert "repos" in raw.get("hub", {}), f"{path.name}: no hub.repos"
        repos = raw["hub"]["repos"]
        # an empty list says no release has the served layout; the README's row says so in words
        row = f"| `{raw['name']}` | " + (", ".join(f"`{r}`" for r in repos) + " |" if repos else "none released")
        assert row in readme, row
