# eprun: two commands for a newcomer.
#   make lab    create .venv with the stack pinned for your Python, build the lab models, write
#               every deliverable
#   make test   run the test suite on the pinned stack, then on the oldest supported stack, then
#               the execution-provider tests on OpenVINO in both packagings (make test-ep), then
#               Model Explorer's and matplotlib's views of the answers in a browser (make test-viz)
#
# PYTHON picks the interpreter .venv is built from (make lab PYTHON=python3.12). A name like
# python3.10 that does not run by itself (a pyenv shim of a version that is not selected) is
# looked up through pyenv. make lab installs the stack pinned for that Python's version:
#   3.11 - 3.13   requirements.txt        the pinned current stack, which made the committed files
#   3.10          requirements-py310.txt  the newest onnxruntime, onnx and numpy for 3.10
#   3.9           requirements-py39.txt   the newest onnxruntime, onnx and numpy for 3.9
# (LAB_REQS=file overrides the choice.) make test and make bench need the pinned current stack,
# so a Python from 3.11 to 3.13.
# .venv is rebuilt from scratch when another Python version made it, when its Python no longer
# runs, or when an install into it did not finish; make clean removes every venv.
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

# The interpreter PYTHON names: itself if it runs, else pyenv's for a name python3.X.
PY := $(shell p='$(PYTHON)'; v=$$(echo "$$p" | sed -n 's/^python\([0-9][0-9.]*\)$$/\1/p'); \
        for q in "$$p" $${v:+"$$(pyenv prefix "$$v" 2>/dev/null)/bin/python$$v"}; do \
          "$$q" -c '' >/dev/null 2>&1 && { command -v "$$q"; break; }; done)
PY_VERSION_OF = $(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PY_VERSION := $(if $(PY),$(call PY_VERSION_OF,$(PY)))

# The stack make lab installs for each Python version (see the top of this file).
STACK_3.9 = requirements-py39.txt
STACK_3.10 = requirements-py310.txt
STACK_3.11 = requirements.txt
STACK_3.12 = requirements.txt
STACK_3.13 = requirements.txt
LAB_REQS ?= $(STACK_$(PY_VERSION))

PY_IS = PYTHON=$(PYTHON) $(if $(PY_VERSION),is Python $(PY_VERSION),does not run \
  (not on PATH, nor through pyenv))
# One line, before anything is installed, when no pinned stack fits PYTHON.
NEED_LAB_STACK = $(if $(LAB_REQS),,$(error make lab needs Python 3.9 to 3.13: $(PY_IS)))
NEED_PINNED_STACK = $(if $(filter requirements.txt,$(STACK_$(PY_VERSION))),,$(error \
  make test and make bench need Python 3.11 to 3.13 (the pinned stack): $(PY_IS)))

# A .venv made by another Python version, or whose Python no longer runs, is out of date
# whatever its stamps say: FORCE makes its install rules run, and venv_install rebuilds it.
VENV_STALE := $(if $(filter $(PY_VERSION),$(call PY_VERSION_OF,$(VENV)/bin/python)),,FORCE)

.PHONY: lab models deliverables test lint test-current test-oldest test-ep test-viz docs-images bench bench-ep mutation same-answers clean FORCE

lab: $(VENV)/.lab-installed
	$(MAKE) --no-print-directory deliverables RUN=$(VENV)/bin/python

models:
	$(RUN) gen_ep.py

deliverables: models
	$(RUN) eprun.py report fp32.onnx int8.onnx --seed $(SEED) > /dev/null

test: lint test-current test-oldest test-ep test-viz

# ruff with the rules and reasons in pyproject.toml (line length 100, B, PL, PT, SIM, ISC, ...).
lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .

test-current: $(VENV)/.dev-installed
	$(VENV)/bin/python -m pytest

test-oldest:
	@if [ -z "$(OLD_PYTHON)" ]; then \
	  echo "test-oldest: no Python 3.9 found; set OLD_PYTHON=/path/to/python3.9 to run the oldest stack"; \
	else \
	  $(MAKE) --no-print-directory $(OLD_VENV)/.dev-installed && $(OLD_VENV)/bin/python -m pytest; \
	fi

# tests/test_ep.py on a real second execution provider, in both forms users get EPs in: a venv
# with onnxruntime-openvino (OpenVINO built in) and one with onnxruntime plus plugin EP
# packages (OpenVINO's, and a plugin CPU EP that offers a device on any CPU). Needs the pinned
# stack's Python (3.11 - 3.13); about 900 MB of venvs.
EP_VENVS = .venv-openvino .venv-plugin

test-ep: .venv-openvino/.dev-installed .venv-plugin/.dev-installed
	.venv-openvino/bin/python -m pytest tests/test_ep.py
	.venv-plugin/bin/python -m pytest tests/test_ep.py

# tests/test_viz.py in a venv of its own (requirements-viz.txt: Model Explorer and its ONNX
# adapter, matplotlib, selenium) with Debian's chromium and chromium-driver, which it installs
# when it runs as root on Debian and they are missing (CI); elsewhere a missing browser stops
# it with one line saying what to install.
VIZ_VENV = .venv-viz
BROWSER_CHECK = command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "make: needs Debian's chromium and chromium-driver: sudo apt-get install chromium chromium-driver"; exit 1; \
	  fi; }

test-viz: $(VIZ_VENV)/.dev-installed
	@$(BROWSER_CHECK)
	EPRUN_TEST_VIZ=1 $(VIZ_VENV)/bin/python -m pytest tests/test_viz.py

# The README's two pictures, from eprun commands run on the lab pair (docs/make_images.py).
docs-images: $(VIZ_VENV)/.dev-installed
	@$(BROWSER_CHECK)
	$(VIZ_VENV)/bin/python docs/make_images.py

$(VIZ_VENV)/.dev-installed: requirements-viz.txt requirements-dev.txt requirements-dask.txt requirements.txt $(VENV_STALE)
	$(NEED_PINNED_STACK)$(call venv_install,$(VIZ_VENV),$(PY),requirements-viz.txt)
	touch $@

.venv-openvino/.dev-installed: requirements-ep-openvino.txt $(VENV_STALE)
	$(NEED_PINNED_STACK)$(call venv_install,.venv-openvino,$(PY),requirements-ep-openvino.txt)
	touch $@

.venv-plugin/.dev-installed: requirements-ep-plugin.txt $(VENV_STALE)
	$(NEED_PINNED_STACK)$(call venv_install,.venv-plugin,$(PY),requirements-ep-plugin.txt)
	touch $@

# Wall time and peak memory against the hand-written floor, qdq_loss_debug and Polygraphy;
# a few minutes and ~3 GB of scratch disk (BENCH_FLAGS=--skip-large for the lab pair only).
bench: $(VENV)/.bench-installed
	$(VENV)/bin/python bench/bench.py $(BENCH_FLAGS)

# layers --providers OpenVINOExecutionProvider against the same three sessions by hand (fp32
# exposed on the CPU, int8 exposed and plain on the EP), on OpenVINO built in and as a plugin EP
# (the plugin offers Intel devices only: elsewhere its run stops with eprun's exit 4).
OPENVINO_PLUGIN = $$(.venv-plugin/bin/python -c 'import onnxruntime_ep_openvino as m; print(m.get_library_path())')

bench-ep: $(VENV)/.lab-installed .venv-openvino/.dev-installed .venv-plugin/.dev-installed
	$(VENV)/bin/python bench/bench.py --only-ep --ep-python .venv-openvino/bin/python $(BENCH_FLAGS)
	$(VENV)/bin/python bench/bench.py --only-ep --ep-python .venv-plugin/bin/python \
	  --ep-library "$(OPENVINO_PLUGIN)" $(BENCH_FLAGS)

# $(call venv_install,VENV,PYTHON,REQUIREMENTS): pip-install REQUIREMENTS into VENV, a venv of
# PYTHON. VENV is first removed when another Python version made it, when its Python no longer
# runs, or when an earlier install did not finish (it leaves VENV/.installing behind).
define venv_install
	@want=$$($(2) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	have=$$($(1)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); \
	why="it was made with Python $$have, not $$want"; \
	[ -n "$$have" ] || why="its Python does not run"; \
	if [ -e $(1) ] && [ ! -f $(1)/pyvenv.cfg ]; then \
	  echo "make: $(1) is not a venv; move it away or set VENV"; exit 1; \
	elif [ -e $(1) ] && [ "$$have" != "$$want" ]; then \
	  echo "make: rebuilding $(1): $$why"; rm -rf $(1); \
	elif [ -e $(1)/.installing ]; then \
	  echo "make: rebuilding $(1): an earlier install into it did not finish"; rm -rf $(1); \
	fi
	test -d $(1) || $(2) -m venv $(1)
	@touch $(1)/.installing
	@echo "$(1)/bin/python -m pip install -r $(3)"
	@$(1)/bin/python -m pip install $(PIP_FLAGS) -r $(3) || { \
	  echo "make: installing $(3) into $(1) failed; rerun make to rebuild $(1), or make clean"; \
	  exit 1; }
	@rm $(1)/.installing
endef

$(VENV)/.lab-installed: $(LAB_REQS) $(VENV_STALE)
	$(NEED_LAB_STACK)$(call venv_install,$(VENV),$(PY),$(LAB_REQS))
	touch $@

$(VENV)/.bench-installed: requirements.txt requirements-bench.txt requirements-dask.txt $(VENV_STALE)
	$(NEED_PINNED_STACK)$(call venv_install,$(VENV),$(PY),requirements-bench.txt)
	touch $@

$(VENV)/.dev-installed: requirements.txt requirements-dev.txt requirements-dask.txt $(VENV_STALE)
	$(NEED_PINNED_STACK)$(call venv_install,$(VENV),$(PY),requirements-dev.txt)
	touch $@ $(VENV)/.lab-installed

$(OLD_VENV)/.dev-installed: requirements-oldest.txt
	$(call venv_install,$(OLD_VENV),$(OLD_PYTHON),requirements-oldest.txt)
	touch $@

FORCE:

clean:
	rm -rf $(VENV) $(OLD_VENV) $(EP_VENVS) $(VIZ_VENV) .venv-py39 .venv-py310 .pytest_cache tests/__pycache__ __pycache__ build dist *.egg-info small.onnx small.inputs.npz

# Mutation testing: plant one bug at a time in a copy of eprun.py and check the suite goes red
# (tests/mutation.py; MUTANTS=N sets the sample size, MUTATION_FLAGS adds options, e.g.
# "--only planted: --jobs 1"). Takes tens of minutes; not part of make test, not run by CI.
MUTANTS ?= 60

mutation: $(VENV)/.dev-installed
	$(VENV)/bin/python tests/mutation.py --sample $(MUTANTS) $(MUTATION_FLAGS)

# A change meant to keep behaviour (a move, a rename, a split), proven: every command on the lab
# models, every README example, the tests' real-shaped models and their quantized twins and the
# usual mistakes, run by BEFORE's eprun.py and by the working tree's; stdout, stderr, exit codes
# and written files must be the same bytes (bench/same_answers.py; about 4 minutes).
BEFORE ?= HEAD

same-answers: $(VENV)/.dev-installed
	$(VENV)/bin/python bench/same_answers.py --before $(BEFORE)
