# Two commands do everything on a fresh machine:
#   make demo   # venv + install + tiny models (if missing) + the main job on the CPU default
#   make test   # venv + install + lint + the whole test suite (what CI runs: .ci/run)
# and one for the edit loop:
#   make test-fast  # tests/unit only: no trained models, no server
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
TRTSPEC := $(VENV)/bin/trtspec
RECIPE ?= build_configs/tiny-cpu-draft-target.yaml
# Re-install when the project's dependency list changes.
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)

.PHONY: install models demo test test-fast test-thirdparty lint clean-venv image prometheus-tools

install: $(STAMP)

# this machine's pip config lists index folders that do not exist, and pip warns once per package
# for each: those lines are dropped, everything else pip says (and its exit status) is kept
QUIET_PIP := 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }; test $${PIPESTATUS[0]} -eq 0
# Each step says what it does and how long it took on the 2-core reference box (README).
$(STAMP): pyproject.toml
	@echo "[install 1/5] venv $(VENV) and pip (about 10 s)"
	@test -x $(PYTHON) || $(PY) -m venv $(VENV)
	@$(PYTHON) -m pip install -q -U pip $(QUIET_PIP)
	@echo "[install 2/5] torch 2.13.0, the CPU build (about 30 s)"
	@# torch first, pinned: the CPU build lies on local disk; an unpinned torch pulls a multi-GB CUDA build.
	@$(PYTHON) -m pip install -q torch==2.13.0 $(QUIET_PIP)
	@echo "[install 3/5] trtspec[all,dev]: ModelOpt, transformers, tritonserver (nvidia-pytriton), tritonclient (about 80 s)"
	@$(PYTHON) -m pip install -q -e ".[all,dev]" $(QUIET_PIP)
	@echo "[install 4/5] trtspec's CPU weight-only kernels: compiled once into ~/.cache/trtspec/kernels (about 30 s; the bf16 build on an AVX512-BF16 CPU, the fma build on other AVX512 CPUs, skipped without AVX512)"
	@$(PYTHON) -c 'from trtspec.speculative.kernels import wo_cpu_status; print("      INT4/INT8 layers on CPU:", wo_cpu_status())'
	@echo "[install 5/5] done: $(TRTSPEC)"
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

models: $(STAMP)
	$(TRTSPEC) models tiny --out models

# `trtspec run` exits 0 (deploy speculative) or 1 (keep the baseline): both are a finished demo.
demo: models
	@$(TRTSPEC) run $(RECIPE); rc=$$?; if [ $$rc -gt 1 ]; then exit $$rc; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# two pytest-xdist workers, a file per worker at a time (its module-scoped server stays on one),
# in the order tests/conftest.py gives (the wheel's venv installs first, beside the tiny pair's
# training); XDIST= runs the suite in one process
XDIST ?= -n 2 --dist loadfile --no-loadscope-reorder
# tiers: tests/unit (no trained models, no server), tests/engine (the trained tiny pair),
# tests/serving (a real tritonserver), tests/pipeline (trtspec run end to end)
test: lint prometheus-tools
	$(PYTHON) -m pytest -q --durations=20 --basetemp="$(CURDIR)/.pytest_tmp" $(XDIST) --ignore=tests/thirdparty tests

# tools trtspec did not write, against the served tiny pair: genai-perf 0.0.16 in its own venv
# (.venv-perf, with tritonclient 2.51 and pandas<2.3; about 2 min to install). Not in `make test`:
# CI's 15-minute budget
PERF_VENV ?= .venv-perf
test-thirdparty: $(STAMP)
	@test -x $(PERF_VENV)/bin/genai-perf || { echo "[test-thirdparty] venv $(PERF_VENV): genai-perf 0.0.16"; \
	  $(PY) -m venv $(PERF_VENV) && $(PERF_VENV)/bin/pip install -q genai-perf==0.0.16 'tritonclient[all]==2.51.0' 'pandas<2.3' $(QUIET_PIP); }
	$(PYTHON) -m pytest -q --basetemp="$(CURDIR)/.pytest_tmp" tests/thirdparty

# promtool and prometheus, Debian's `prometheus` package (2.42 on Debian 12): the rules' unit tests
# (tests/unit/test_prometheus_rules.py) and the dashboard evaluated by a real Prometheus
# (tests/serving/test_openloop_serving.py). Nothing to do when both are on PATH; as root with apt-get
# it installs them (without the recommended node exporter) and stops the daemon the package may
# start (the tests run their own on a free port); otherwise it says how, and those tests skip.
prometheus-tools:
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "[prometheus-tools] apt-get install prometheus (promtool, prometheus; about 30 s)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null || exit 1; \
	  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then systemctl stop prometheus; fi; \
	else \
	  echo "[prometheus-tools] promtool/prometheus not found: run 'sudo apt-get install prometheus' (Debian, Ubuntu) or put Prometheus's own binaries on PATH; until then the Prometheus tests skip"; \
	fi

test-fast: $(STAMP)
	$(PYTHON) -m pytest -q --basetemp="$(CURDIR)/.pytest_tmp" $(XDIST) tests/unit

# the serving image `trtspec deploy k8s` defaults to: docker/Dockerfile on the recipe's NVIDIA
# Triton TRT-LLM base, tagged trtspec-triton:<version>-<release> (needs docker; not run in CI)
IMAGE_RECIPE ?= build_configs/llama3.1-8b-eagle3-fp8-trtllm.yaml
image: $(STAMP)
	tag=$$($(PYTHON) -c 'import sys; from trtspec.config import load_recipe; from trtspec.deploy.k8s import serving_image; print(serving_image(load_recipe(sys.argv[1])))' $(IMAGE_RECIPE)) && \
	base=$$($(PYTHON) -c 'import sys; from trtspec.config import load_recipe; print(load_recipe(sys.argv[1]).runtime.trtllm.container_image)' $(IMAGE_RECIPE)) && \
	docker build -f docker/Dockerfile --build-arg BASE_IMAGE=$$base -t $$tag .

clean-venv:
	rm -rf $(VENV)
