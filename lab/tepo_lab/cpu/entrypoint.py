"""The lab's entry point in verl's `verl.plugins` group (lab/setup.py): `import verl` imports this module in every
verl process (the driver, the Ray workers, vLLM's worker processes), so the CPU mode is on in each of them when
TEPO_VERL_CPU=1. Otherwise it does nothing and imports nothing beyond tepo_lab.cpu."""

from tepo_lab.cpu import maybe_install

maybe_install()
