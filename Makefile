# eprun: two commands for a newcomer.
#   make lab    create .venv with the pinned stack, build the lab models, write every deliverable
#   make test   run the test suite on the pinned stack, then on the oldest supported stack
#
# PYTHON picks the interpreter .venv is built from (make lab PYTHON=python3.12).
# RUN runs gen_ep.py and eprun.py without any venv, e.g. with a lab machine's own interpreter:
#   make deliverables RUN=/path/to/python
# OLD_PYTHON is a Python 3.9 for the oldest stack; found on PATH or through pyenv when unset.

PYTHON ?= python3
VENV ?= .venv
OLD_VENV ?= .venv-oldest
OLD_PYTHON ?= $(shell for p in python3.9 "$$(pyenv prefix 3.9 2>/dev/null)/bin/python3.9"; do "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 9)' >/dev/null 2>&1 && { command -v "$$p"; break; }; done)
RUN ?= $(VENV)/bin/python
SEED ?= 2026
PIP_FLAGS = --quiet --disable-pip-version-check --no-input

.PHONY: lab models deliverables test test-current test-oldest bench clean

lab: $(VENV)/.lab-installed
	$(MAKE) --no-print-directory deliverables RUN=$(VENV)/bin/python

models:
	$(RUN) gen_ep.py

deliverables: models
	$(RUN) eprun.py report fp32.onnx int8.onnx --seed $(SEED) > /dev/null

test: test-current test-oldest

test-current: $(VENV)/.dev-installed
	$(VENV)/bin/python -m pytest

test-oldest:
	@if [ -z "$(OLD_PYTHON)" ]; then \
	  echo "test-oldest: no Python 3.9 found; set OLD_PYTHON=/path/to/python3.9 to run the oldest stack"; \
	else \
	  $(MAKE) --no-print-directory $(OLD_VENV)/.dev-installed && $(OLD_VENV)/bin/python -m pytest; \
	fi

# Wall time and peak memory against the hand-written floor, qdq_loss_debug and Polygraphy;
# a few minutes and ~3 GB of scratch disk (BENCH_FLAGS=--skip-large for the lab pair only).
bench: $(VENV)/.bench-installed
	$(VENV)/bin/python bench/bench.py $(BENCH_FLAGS)

$(VENV)/.bench-installed: requirements.txt requirements-bench.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install $(PIP_FLAGS) -r requirements-bench.txt
	touch $@

$(VENV)/.lab-installed: requirements.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install $(PIP_FLAGS) -r requirements.txt
	touch $@

$(VENV)/.dev-installed: requirements.txt requirements-dev.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install $(PIP_FLAGS) -r requirements-dev.txt
	touch $@ $(VENV)/.lab-installed

$(OLD_VENV)/.dev-installed: requirements-oldest.txt
	test -x $(OLD_VENV)/bin/python || $(OLD_PYTHON) -m venv $(OLD_VENV)
	$(OLD_VENV)/bin/python -m pip install $(PIP_FLAGS) -r requirements-oldest.txt
	touch $@

clean:
	rm -rf $(VENV) $(OLD_VENV) .pytest_cache tests/__pycache__ __pycache__
