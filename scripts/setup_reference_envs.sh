#!/usr/bin/env bash
# Reference environments for parity tests whose reference package pins a transformers that clashes
# with ours (.venv has transformers 5). Each lives in its own venv next to .venv; the tests run it
# as a subprocess and skip (saying so) when it is missing. Idempotent: a stamp per venv records the
# recipe it was built from, and a changed recipe rebuilds it.
#
#   bash scripts/setup_reference_envs.sh            # all of them
#   bash scripts/setup_reference_envs.sh qwen-tts   # .venv-qwentts: qwen-tts 0.1.1 (transformers 4.57.3)
#
# `make test` (and so CI) runs it before the tests: a few minutes the first time, ~1.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}        # the CPU build here; a GPU machine may pass its CUDA torch

qwen_tts() {
  local venv=.venv-qwentts
  local stamp="$venv/.installed-$( (declare -f qwen_tts; echo "$TORCH_SPEC") | sha1sum | cut -c1-12)"
  [ -f "$stamp" ] && return 0
  echo "[reference] building $venv (qwen-tts 0.1.1, transformers 4.57.3)"
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  echo '*' > "$venv/.gitignore"                   # never committed (python < 3.13 venvs lack this file)
  local pip="$venv/bin/python -m pip install -q"
  $pip --upgrade pip
  $pip "$TORCH_SPEC"
  # qwen-tts without its dependency list (it wants gradio and a CUDA torchaudio), then what it imports
  $pip --no-deps qwen-tts==0.1.1
  $pip transformers==4.57.3 accelerate==1.12.0 "numpy<2.4" librosa soundfile sox onnxruntime einops
  # torchaudio: only its pure-Python part is imported (qwen_tts.core imports torchaudio.compliance.kaldi
  # for the 25 Hz tokenizer); PyPI's wheel is a CUDA build whose .so files do not load on a CPU torch,
  # so they are moved aside there (torchaudio then imports without its extension)
  $pip --no-deps torchaudio==2.11.1
  if ! "$venv/bin/python" -c "import torchaudio" >/dev/null 2>&1; then
    local ta
    ta=$("$venv/bin/python" -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torchaudio').origin))")
    mkdir -p "$venv/torchaudio-so-disabled"
    find "$ta" -name '*.so' -exec mv {} "$venv/torchaudio-so-disabled/" \;
  fi
  "$venv/bin/python" -c "import qwen_tts, transformers; assert transformers.__version__ == '4.57.3'" >/dev/null 2>&1 \
    || { echo "[reference] $venv: qwen_tts does not import" >&2; exit 1; }
  touch "$stamp"
}

for name in "${@:-qwen-tts}"; do
  case "$name" in
    qwen-tts) qwen_tts ;;
    *) echo "unknown reference environment: $name (known: qwen-tts)" >&2; exit 2 ;;
  esac
done
