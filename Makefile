# The two commands of the README. Each bootstraps .venv on a fresh machine (idempotent): torch
# (lock/torch.txt; the CPU build when no NVIDIA GPU is visible, else the default CUDA build and
# bitsandbytes from lock/gpu.txt), then
# exactly the versions of the lock, with their hashes, and checks the venv against the lock.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH := $(shell grep -E '^torch==' lock/torch.txt)
# Where pip finds the CPU build: this machine's wheel folder has it. Elsewhere, e.g.
# make test TORCH_CPU="$(TORCH) --index-url https://download.pytorch.org/whl/cpu"
TORCH_CPU ?= $(TORCH)
TORCH_GPU ?= $(TORCH)
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# The lock is complete (every requirement of every package in it), so nothing else is resolved.
PIP_LOCKED := $(PIP) --no-deps --require-hashes
# make lock resolves torch's own requirements against its CPU build (no CUDA libraries in the lock):
# here from the machine's wheel folder; elsewhere LOCK_TORCH_SOURCE="--extra-index-url URL".
LOCK_TORCH_SOURCE ?= --find-links /opt/wheels
# The oldest Python the lock serves: pyproject.toml's requires-python; make lock resolves for it.
PYTHON_MIN := $(shell sed -n 's/^requires-python = ">=\([0-9.]*\)"$$/\1/p' pyproject.toml)
LOCK_PYTHON ?= $(PYTHON_MIN)
UV_COMPILE = $(VENV)/bin/uv pip compile --quiet --generate-hashes --python-version $(LOCK_PYTHON) \
	--custom-compile-command "make lock" -c lock/torch.txt --no-emit-package torch $(LOCK_TORCH_SOURCE)
# pytest-xdist: one test process per core (each on one thread: tests/conftest.py); an idle worker
# takes tests queued for the other (worksteal: 6m11 against 7m46 for load on 2 cores)
PYTEST_WORKERS ?= auto
PYTEST_ARGS ?=
# The portable leg: the CPU-path-sensitive tests (-m cpu_path: packed weights, bf16 and autocast, the learner goldens,
# an RL iteration with a bf16 reflector) again on the oldest x86 path the project supports, AVX2, forced on whatever
# CPU this is by the reference path's variables (utils/cpu.py: ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2,
# MKL_CBWR, NumPy's); tests/test_cpu.py checks that they really force it. PORTABLE_LEG=0 skips it.
PORTABLE_LEG ?= 1

# A column on one GPU (recipes/gpu.py; docs/gpu.md, "The GPU profile"). gpu-bundle (here, with PyPI at hand) packs what a GPU
# machine without the project's packages lacks into parts of at most 60 MiB; gpu-column runs the column there from
# the parts (the machine's own python3 with torch) or, without a bundle, from this venv, and packs what it measured
# into $(GPU_OUT)/<column>-seed<N>/.
COLUMN ?= auto_explore
SEED ?= 0
GPU_BUNDLE ?= build/gpu-bundle
GPU_OUT ?= results/gpu

.PHONY: demo test lint lock check-lock clean-venv gpu-bundle gpu-column

demo: $(VENV)/.stamp-demo
	$(PY) lock/check.py lock/demo.txt
	$(PY) demo.py

test: $(VENV)/.stamp-test
	$(PY) lock/check.py lock/test.txt
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=20 $(PYTEST_ARGS)
	@if [ "$(PORTABLE_LEG)" = 1 ]; then echo "The portable leg: the cpu_path tests on the AVX2 path"; \
		REFLECTRL_PORTABLE_LEG=1 $(PY) -m utils.cpu $(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m cpu_path; fi

gpu-bundle: $(VENV)/.stamp-test
	$(PY) -m gpu.bundle --column $(COLUMN) --output_dir $(GPU_BUNDLE)

gpu-column:
	@if [ -d "$(GPU_BUNDLE)" ]; then \
		python3 -m gpu.column --column $(COLUMN) --seed $(SEED) --bundle $(GPU_BUNDLE) --out $(GPU_OUT); \
	else \
		$(MAKE) --no-print-directory $(VENV)/.stamp-test && $(PY) lock/check.py lock/test.txt && \
		$(PY) -m gpu.column --column $(COLUMN) --seed $(SEED) --out $(GPU_OUT); \
	fi

lint: $(VENV)/.stamp-test
	$(PY) -m ruff check .

check-lock: $(VENV)/.stamp-torch
	@test -x $(VENV)/bin/uv || $(PIP) "$$(sed -n 's/^\(uv==[^ ]*\).*/\1/p' lock/test.txt 2>/dev/null | grep . || echo uv)"
	$(PY) lock/check.py lock/test.txt

# Refresh the lock to the newest releases that pyproject.toml's ranges allow (then re-take the
# goldens if numbers moved; see CONTRIBUTING.md). demo.txt is resolved within test.txt, so the two agree.
lock: $(VENV)/.stamp-torch
	@test -x $(VENV)/bin/uv || $(PIP) "$$(sed -n 's/^\(uv==[^ ]*\).*/\1/p' lock/test.txt 2>/dev/null | grep . || echo uv)"
	$(UV_COMPILE) --upgrade pyproject.toml lock/model.in --extra dev --extra alfworld \
		--excludes lock/no-deps.txt -o lock/test.txt
	$(UV_COMPILE) pyproject.toml -c lock/test.txt -o lock/demo.txt

$(VENV)/.stamp-torch: lock/torch.txt lock/gpu.txt
	@test -x $(PY) || $(PYTHON) -c 'import sys; sys.exit(sys.version_info < tuple(map(int, "$(PYTHON_MIN)".split("."))))' \
		|| { echo "make: $(PYTHON) is $$($(PYTHON) -V 2>&1); the lock needs Python >= $(PYTHON_MIN)" \
		"(e.g. make test PYTHON=python3.12)" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "NVIDIA GPU found: installing $(TORCH_GPU) and lock/gpu.txt"; $(PIP) $(TORCH_GPU) && \
		$(PIP_LOCKED) -r lock/gpu.txt; \
	else \
		echo "No NVIDIA GPU: installing $(TORCH_CPU)"; $(PIP) $(TORCH_CPU); \
	fi
	@touch $@

$(VENV)/.stamp-demo: $(VENV)/.stamp-torch lock/demo.txt
	$(PIP_LOCKED) -r lock/demo.txt
	@touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-torch lock/test.txt
	$(PIP_LOCKED) -r lock/test.txt
	@touch $@

clean-venv:
	rm -rf $(VENV)
