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

.PHONY: install models demo test test-fast lint clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q -U pip
	# torch first, pinned: the CPU build lies on local disk; an unpinned torch pulls a multi-GB CUDA build.
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q -e ".[all,dev]"
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

models: $(STAMP)
	$(TRTSPEC) models tiny --out models

# `trtspec run` exits 0 (deploy speculative) or 1 (keep the baseline): both are a finished demo.
demo: models
	@$(TRTSPEC) run $(RECIPE); rc=$$?; if [ $$rc -gt 1 ]; then exit $$rc; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# tiers: tests/unit (no trained models, no server), tests/engine (the trained tiny pair),
# tests/serving (a real tritonserver), tests/pipeline (trtspec run end to end)
test: lint
	$(PYTHON) -m pytest -q --basetemp="$(CURDIR)/.pytest_tmp" tests

test-fast: $(STAMP)
	$(PYTHON) -m pytest -q --basetemp="$(CURDIR)/.pytest_tmp" tests/unit

clean-venv:
	rm -rf $(VENV)
