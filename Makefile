# Two commands on a fresh machine (Python 3.10-3.13, Linux x86_64):
#   make demo   set up, build the model repository with tiny random checkpoints, start the real
#               tritonserver, stream a chat answer, write outputs/, stop the server
#   make test   set up and run the whole test suite
PY := .venv/bin/python
OMNI := .venv/bin/triton-omni

.PHONY: setup demo test repo check-repo tiny serve clean

setup:
	bash scripts/setup.sh

tiny: setup
	$(OMNI) tiny

repo: setup tiny
	$(OMNI) build

check-repo: setup
	$(OMNI) check

demo: setup
	$(PY) scripts/demo.py

test: setup
	bash scripts/setup_reference_envs.sh
	$(PY) -m pytest -q tests

serve: setup tiny
	$(OMNI) serve --model-repository model_repository --models qwen3_chat

clean:
	rm -rf .venv checkpoints outputs
