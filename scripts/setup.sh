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
stamp=".venv/.installed-$(cat pyproject.toml setup.py scripts/setup.sh | sha1sum | cut -c1-12)"
# pip's own progress bars on a terminal; quiet in CI and in logs
Q=-q; if [ -t 1 ] && [ -z "${CI:-}" ]; then Q=--progress-bar=on; fi
if [ ! -f "$stamp" ]; then
  echo "[setup] installing dependencies into .venv (first run takes a few minutes)"
  .venv/bin/python -m pip install $Q --upgrade pip
  .venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install $Q "$TORCH_SPEC"
  .venv/bin/python -m pip install $Q -e '.[test]'
  # The Kokoro parity test's reference (its KModel needs only torch, transformers and loguru; its
  # declared dependencies bring misaki's spaCy G2P, which the test does not import)
  .venv/bin/python -m pip install $Q --no-deps kokoro==0.9.4
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# espeak-ng: kokoro_tts's offline text -> phonemes (python_backends/tts/kokoro/text.py). Optional:
# without it kokoro_tts takes `phonemes` only. Installed only where apt-get can run (as root).
if ! command -v espeak-ng >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
     && { apt-get install -y -q espeak-ng >/dev/null 2>&1 \
          || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q espeak-ng >/dev/null 2>&1; }; }; then
    echo "[setup] installed espeak-ng (Kokoro's text front end)"
  else
    echo "[setup] espeak-ng is not installed and apt-get cannot install it here (not root?): kokoro_tts" \
         "will accept phonemes only, and its text tests are skipped"
  fi
fi
# chromium + chromium-driver: the playground page's test runs in a real headless browser
# (tests/test_operations.py). Optional: without them that test is skipped.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
     && { apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
          || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }; }; then
    echo "[setup] installed chromium and chromium-driver (the playground's browser test)"
  else
    echo "[setup] chromium is not installed and apt-get cannot install it here (not root?): the playground's" \
         "browser test is skipped"
  fi
fi
# The server's python backend needs its stub next to libtriton_python.so, matching this Python.
.venv/bin/triton-omni setup
