"""`tepo-verl COMMAND ...`: one entry point for the plugin's tools (each is also `python -m MODULE`).

Bad input gets a one-line error and a non-zero exit from each command; anything a command does not expect is
also turned into one line here (TEPO_VERL_DEBUG=1 re-raises it with the traceback), a missing extra included
(tepo_verl/extras.py). The lab's commands (demo, tiny, cpu-check) are `tepo-lab`'s: `tepo-verl` says where.
"""

from __future__ import annotations

import importlib
import os
import sys

from tepo_verl.extras import MissingExtra

#: command -> (module:function taking argv, one-line help)
COMMANDS = {
    "data": ("tepo_verl.data.cli:main", "convert maths data sets to verl parquet; contamination check"),
    "eval": ("tepo_verl.evaluation.cli:main", "avg@k / pass@k / maj@k per benchmark from validation generations"),
    "compare": ("tepo_verl.report.compare:main", "compare algorithms from verl file-logger runs (table, plots)"),
    "doctor": ("tepo_verl.report.doctor:main", "read one run; one line per health check, each with its fix"),
}

#: Commands of the CPU lab (lab/, package tepo_lab, command `tepo-lab`), which the plugin does not carry.
LAB_COMMANDS = ("demo", "tiny", "cpu-check")


def usage(prog: str, commands: dict) -> str:
    width = max(map(len, commands))
    lines = [f"usage: {prog} COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in commands.items()]
    return "\n".join(lines)


def lab_command(name: str) -> str:
    """Where a lab command runs (one line)."""
    target = "make demo" if name == "demo" else f"tepo-lab {name}"
    return (f"tepo-verl: {name!r} is a command of the CPU lab, not of the plugin: run `{target}` in a checkout of "
            f"tepo-verl (`make install` installs the lab and its `tepo-lab` command)")


def dispatch(prog: str, commands: dict, argv: list[str], elsewhere=None) -> int:
    """Run `commands[argv[0]]` with the rest of argv; `elsewhere(name)` is the one line for a command kept in another
    package (None: unknown)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog, commands))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        if elsewhere is not None and elsewhere(name):
            print(elsewhere(name), file=sys.stderr)
            return 2
        print(f"{prog}: unknown command {name!r}; valid: {', '.join(commands)}\n\n{usage(prog, commands)}",
              file=sys.stderr)
        return 2
    module, function = commands[name][0].split(":")
    try:
        return int(getattr(importlib.import_module(module), function)(rest) or 0)
    except KeyboardInterrupt:
        print(f"{prog} {name}: interrupted", file=sys.stderr)
        return 130
    except MissingExtra as error:  # its message says everything: what is missing and the pip line
        print(f"{prog} {name}: error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # noqa: BLE001 - the last guard: one line, never a traceback
        if os.environ.get("TEPO_VERL_DEBUG") == "1":
            raise
        first = (str(error).strip().splitlines() or [""])[0]
        print(f"{prog} {name}: error: {type(error).__name__}: {first} (TEPO_VERL_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return dispatch("tepo-verl", COMMANDS, argv, lambda name: lab_command(name) if name in LAB_COMMANDS else None)


if __name__ == "__main__":
    raise SystemExit(main())
