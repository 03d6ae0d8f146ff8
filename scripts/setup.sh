#!/usr/bin/env bash
# Set up everything the project needs, idempotently: a virtual environment in .venv with the pinned
# dependencies, the project installed in it (editable), and the Triton backend folder in .triton/.
# Re-running is cheap: the install step runs again only when pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# torch: a CPU machine gets the 2.13.0 CPU build; set TORCH_SPEC to choose another (e.g. a CUDA build).
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing dependencies into .venv (first run takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install -q "$TORCH_SPEC"
  .venv/bin/python -m pip install -q -e '.[test]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# The server's python backend needs its stub next to libtriton_python.so, matching this Python.
.venv/bin/python -m launcher setup
