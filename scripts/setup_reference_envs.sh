#!/usr/bin/env bash
# Reference environments for parity tests whose reference package pins a transformers that clashes
# with ours (.venv has transformers 5). Each lives in its own venv next to .venv; the tests run it
# as a subprocess and skip (saying so) when it is missing. Idempotent: a stamp per venv records the
# recipe it was built from, and a changed recipe rebuilds it.
#
#   bash scripts/setup_reference_envs.sh            # all of them
#   bash scripts/setup_reference_envs.sh qwen-tts   # .venv-qwentts: qwen-tts 0.1.1 (transformers 4.57.3)
#   bash scripts/setup_reference_envs.sh omnivoice  # .venv-omnivoice: omnivoice 0.2.1 (transformers 5.24.0)
#   bash scripts/setup_reference_envs.sh chatterbox # .venv-chatterbox: chatterbox-tts 0.1.7 (transformers 5.2.0)
#   bash scripts/setup_reference_envs.sh fish       # .venv-fish: fish-speech 0.1.0 (S1-mini; Fish S2-Pro has no package)
#   bash scripts/setup_reference_envs.sh higgs      # .venv-higgs: boson-multimodal 0.1.1 (Higgs Audio; transformers 4.46.3)
#
# `make test` (and so CI) runs it before the tests: a few minutes the first time, ~1.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}        # the CPU build here; a GPU machine may pass its CUDA torch

stamp_of() {
  # the stamp file of venv $1 built by function $2: changes with that recipe (and the shared helpers)
  echo "$1/.installed-$( (declare -f "$2" fresh_venv python_torchaudio; echo "$TORCH_SPEC") | sha1sum | cut -c1-12)"
}

fresh_venv() {
  # an empty venv $1 with pip upgraded and torch installed ($2: what it is for, printed)
  echo "[reference] building $1 ($2)"
  rm -rf "$1"
  "$PY" -m venv "$1"
  echo '*' > "$1/.gitignore"                      # never committed (python < 3.13 venvs lack this file)
  "$1/bin/python" -m pip install -q --upgrade pip
  "$1/bin/python" -m pip install -q "$TORCH_SPEC"
}

python_torchaudio() {
  # torchaudio without --deps; PyPI's wheel is a CUDA build whose .so files do not load on a CPU torch,
  # so there they are moved aside (torchaudio then imports without its extension: pure Python only)
  local venv=$1 ta
  "$venv/bin/python" -m pip install -q --no-deps torchaudio==2.11.1
  if ! "$venv/bin/python" -c "import torchaudio" >/dev/null 2>&1; then
    ta=$("$venv/bin/python" -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torchaudio').origin))")
    mkdir -p "$venv/torchaudio-so-disabled"
    find "$ta" -name '*.so' -exec mv {} "$venv/torchaudio-so-disabled/" \;
  fi
}

qwen_tts() {
  local venv=.venv-qwentts stamp
  stamp=$(stamp_of "$venv" qwen_tts)
  [ -f "$stamp" ] && return 0
  fresh_venv "$venv" "qwen-tts 0.1.1, transformers 4.57.3"
  local pip="$venv/bin/python -m pip install -q"
  # qwen-tts without its dependency list (it wants gradio and a CUDA torchaudio), then what it imports
  $pip --no-deps qwen-tts==0.1.1
  $pip transformers==4.57.3 accelerate==1.12.0 "numpy<2.4" librosa soundfile sox onnxruntime einops
  # torchaudio: only its pure-Python part is imported (qwen_tts.core imports torchaudio.compliance.kaldi
  # for the 25 Hz tokenizer)
  python_torchaudio "$venv"
  "$venv/bin/python" -c "import qwen_tts, transformers; assert transformers.__version__ == '4.57.3'" >/dev/null 2>&1 \
    || { echo "[reference] $venv: qwen_tts does not import" >&2; exit 1; }
  touch "$stamp"
}

omnivoice() {
  # omnivoice's pins (transformers>=5.3) do not clash with .venv; it lives apart all the same because it
  # imports torchaudio, pydub and soundfile at import time, which the product does not need
  local venv=.venv-omnivoice stamp
  stamp=$(stamp_of "$venv" omnivoice)
  [ -f "$stamp" ] && return 0
  fresh_venv "$venv" "omnivoice 0.2.1, transformers 5.24.0"
  local pip="$venv/bin/python -m pip install -q"
  # without its dependency list (gradio, tensorboardx, webdataset: demo and training only), then what
  # the model and its audio utilities import
  $pip --no-deps omnivoice==0.2.1
  $pip transformers==5.24.0 accelerate==1.12.0 "numpy<2.4" soundfile pydub
  # torchaudio: only functional.resample (pure Python) is used
  python_torchaudio "$venv"
  "$venv/bin/python" -c "import omnivoice, transformers; assert transformers.__version__ == '5.24.0'" >/dev/null 2>&1 \
    || { echo "[reference] $venv: omnivoice does not import" >&2; exit 1; }
  touch "$stamp"
}

chatterbox() {
  # chatterbox-tts pins torch 2.6 and a gradio demo; it lives apart and gets only what `chatterbox.tts`
  # imports (the package's __init__ also imports its voice-conversion and multilingual modules)
  local venv=.venv-chatterbox stamp
  stamp=$(stamp_of "$venv" chatterbox)
  [ -f "$stamp" ] && return 0
  fresh_venv "$venv" "chatterbox-tts 0.1.7, transformers 5.2.0, diffusers 0.29.0"
  local pip="$venv/bin/python -m pip install -q"
  # without their dependency lists (torch pins, gradio, pre-commit): the package, its S3 tokenizer, the
  # Perth watermarker it constructs, and the conformer block its flow decoder imports
  $pip --no-deps chatterbox-tts==0.1.7 s3tokenizer==0.3.0 resemble-perth==1.0.1 conformer==0.3.2
  # then what they import: s3tokenizer imports onnx, Perth pkg_resources (gone from setuptools 81)
  $pip transformers==5.2.0 diffusers==0.29.0 "numpy<2" librosa==0.11.0 safetensors einops omegaconf scipy tqdm \
    onnx "setuptools<81"
  # torchaudio: only its pure-Python part is imported (resampling, kaldi fbank)
  python_torchaudio "$venv"
  "$venv/bin/python" -c "import perth; from chatterbox.tts import ChatterboxTTS; perth.PerthImplicitWatermarker()" \
    >/dev/null 2>&1 \
    || { echo "[reference] $venv: chatterbox does not import" >&2; exit 1; }
  touch "$stamp"
}

fish() {
  # fish-speech 0.1.0 is the older S1-mini release; Fish S2-Pro shares its codec classes and its dual-AR
  # blocks (tests/test_tts_fish_parity.py says what it checks). Without its dependency list (gradio, wandb,
  # lightning, a pinned pydantic and datasets): the package, the DAC code its codec builds on, then what
  # the llama and codec modules import
  local venv=.venv-fish stamp
  stamp=$(stamp_of "$venv" fish)
  [ -f "$stamp" ] && return 0
  fresh_venv "$venv" "fish-speech 0.1.0, descript-audio-codec 1.0.0"
  local pip="$venv/bin/python -m pip install -q"
  $pip --no-deps fish-speech==0.1.0 descript-audio-codec==1.0.0 descript-audiotools==0.7.2
  $pip "numpy<2" einops loguru loralib tiktoken transformers==4.57.3 hydra-core omegaconf librosa soundfile \
    argbind julius flatten-dict ffmpy importlib-resources rich tqdm tensorboard randomname
  python_torchaudio "$venv"
  "$venv/bin/python" -c "from fish_speech.models.text2semantic.llama import DualARTransformer; \
from fish_speech.models.dac.modded_dac import DAC; from fish_speech.models.dac.rvq import DownsampleResidualVectorQuantize" \
    >/dev/null 2>&1 || { echo "[reference] $venv: fish_speech does not import" >&2; exit 1; }
  touch "$stamp"
}

higgs() {
  # boson-multimodal (Higgs Audio) pins transformers <4.47 and pulls a codec, boto3, s3fs, librosa, pandas...
  # for its data pipeline and serving engine; its model code (HiggsAudioModel: Whisper audio tower,
  # projector, Llama decoder) imports only torch and transformers, so that is what it gets
  local venv=.venv-higgs stamp
  stamp=$(stamp_of "$venv" higgs)
  [ -f "$stamp" ] && return 0
  fresh_venv "$venv" "boson-multimodal 0.1.1, transformers 4.46.3"
  local pip="$venv/bin/python -m pip install -q"
  $pip --no-deps boson-multimodal==0.1.1
  # and what its chat-sample preparation (the prompt the tests hold ours against) imports
  $pip transformers==4.46.3 "numpy<2" safetensors dacite pandas loguru
  "$venv/bin/python" -c "from boson_multimodal.model.higgs_audio import HiggsAudioConfig, HiggsAudioModel; \
from boson_multimodal.dataset.chatml_dataset import prepare_chatml_sample" >/dev/null 2>&1 \
    || { echo "[reference] $venv: boson_multimodal does not import" >&2; exit 1; }
  touch "$stamp"
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(qwen-tts omnivoice chatterbox fish higgs)
for name in "${names[@]}"; do
  case "$name" in
    qwen-tts) qwen_tts ;;
    omnivoice) omnivoice ;;
    chatterbox) chatterbox ;;
    fish) fish ;;
    higgs) higgs ;;
    *) echo "unknown reference environment: $name (known: qwen-tts, omnivoice, chatterbox, fish, higgs)" >&2; exit 2 ;;
  esac
done
