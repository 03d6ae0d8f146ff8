"""Command line:

    python -m triton_omni.converters build [--models NAME ...] [--target cpu|gpu] [--out model_repository]
                               [--checkpoint NAME=DIR|hf:ORG/REPO[@REV] ...] [--set NAME.STEP.PARAM=VALUE ...]
                               [--no-verify]
    python -m triton_omni.converters check      # the committed model_repository/ equals what `build` generates
    python -m triton_omni.converters tiny [--out checkpoints/tiny]   # tiny random checkpoints for demo and tests
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from triton_omni.converters import hub
from triton_omni.converters.generate import write_repository
from triton_omni.converters.schema import ConfigError, EnsembleConfig, apply_override, load_ensemble
from triton_omni.converters.verify import verify

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "ensemble_configs"
REPO_DIR = ROOT / "model_repository"


def load_configs(names: list[str] | None, checkpoints: list[str], overrides: list[str],
                 config_dir: Path = CONFIG_DIR) -> list[EnsembleConfig]:
    paths = sorted(config_dir.glob("*.yaml"))
    known = [p.stem for p in paths]
    for n in names or []:
        if n not in known:
            raise SystemExit(f"no ensemble config {n!r} in {config_dir}; known: {', '.join(known)}")
    configs = [load_ensemble(p) for p in paths if not names or p.stem in names]
    by_name = {c.name: c for c in configs}
    for item in checkpoints:
        name, _, folder = item.partition("=")
        if name not in by_name or not folder:
            raise SystemExit(f"--checkpoint expects NAME=DIR or NAME=hf:ORG/REPO[@REV] with NAME one of "
                             f"{', '.join(by_name)}, got {item!r}")
        by_name[name].checkpoint = local_checkpoint(by_name[name], folder)
    for item in overrides:
        key, _, value = item.partition("=")
        name, _, rest = key.partition(".")
        if name not in by_name or not rest or not _:
            raise SystemExit(f"--set expects NAME.KEY=VALUE with NAME one of {', '.join(by_name)}, got {item!r}")
        if rest.endswith("checkpoint") and hub.is_hub(value):     # e.g. orpheus_tts.codec_checkpoint=hf:ORG/REPO
            value = local_checkpoint(by_name[name], value)
        apply_override(by_name[name], rest, value)
    return configs


def local_checkpoint(cfg: EnsembleConfig, value: str) -> str:
    """A folder given on the command line, or `hf:ORG/REPO[@REV]` fetched into the local hub cache."""
    if hub.is_hub(value):
        try:
            return hub.snapshot(value, cfg.hub.get("allow_patterns"))
        except ValueError as e:
            raise SystemExit(f"error: --checkpoint {cfg.name}: {e}") from None
    return str(Path(value).expanduser().resolve())


def tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_omni.converters")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write a model repository from ensemble_configs/")
    b.add_argument("--models", nargs="*", default=None, help="ensembles to include (default: all)")
    b.add_argument("--target", choices=["cpu", "gpu"], default="cpu")
    b.add_argument("--out", type=Path, default=REPO_DIR)
    b.add_argument("--checkpoint", action="append", default=[], metavar="NAME=DIR",
                   help="serve NAME from this Hugging Face folder (config.json + safetensors + tokenizer), or "
                        "from hf:ORG/REPO[@REVISION], fetched into the hub cache ($HF_HOME; HF_HUB_OFFLINE=1: "
                        "from the cache alone)")
    b.add_argument("--set", action="append", default=[], dest="overrides", metavar="NAME.STEP.PARAM=VALUE")
    b.add_argument("--no-verify", dest="verify", action="store_false",
                   help="write the repository without checking the checkpoints it names")
    sub.add_parser("check", help="fail if model_repository/ differs from what build generates")
    t = sub.add_parser("tiny", help="build the tiny random demo/test checkpoints")
    t.add_argument("--out", type=Path, default=ROOT / "checkpoints" / "tiny")
    args = ap.parse_args(argv)

    try:
        if args.cmd == "build":
            configs = load_configs(args.models, args.checkpoint, args.overrides)
            # checked here rather than in write_repository: `check` compares the committed repository
            # with the YAMLs alone, whether or not the checkpoints they name are on this machine
            problems = verify(configs, args.target) if args.verify else []
            for line in problems:
                print(f"error: {line}", file=sys.stderr)
            if problems:
                print("error: checkpoints failed verification; fix them or build with --no-verify", file=sys.stderr)
                return 2
            models = write_repository(configs, args.out, args.target)
            print(f"wrote {args.out}: {', '.join(models)}")
        elif args.cmd == "check":
            with tempfile.TemporaryDirectory() as tmp:
                write_repository(load_configs(None, [], []), Path(tmp), "cpu", location=REPO_DIR)
                want, have = tree(Path(tmp)), tree(REPO_DIR)
            diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            if diff:
                print("model_repository/ is stale; run `python -m triton_omni.converters build`. Differs: " + ", ".join(diff))
                return 1
            print("model_repository/ is up to date")
        elif args.cmd == "tiny":
            from triton_omni.converters.tiny import build

            for name, folder in build(args.out).items():
                print(f"{name}: {folder}")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
