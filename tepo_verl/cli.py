"""`tepo-verl COMMAND ...`: one entry point for the project's tools (each is also `python -m MODULE`).

Bad input gets a one-line error and a non-zero exit from each command; anything a command does not expect is
also turned into one line here (TEPO_VERL_DEBUG=1 re-raises it with the traceback).
"""

from __future__ import annotations

import importlib
import os
import sys

#: command -> (module:function taking argv, one-line help)
COMMANDS = {
    "demo": ("tepo_verl.demo:main", "TEPO vs GRPO vs DAPO through verl's real trainer on CPU, then the comparison"),
    "data": ("tepo_verl.data.cli:main", "convert maths data sets to verl parquet; contamination check"),
    "eval": ("tepo_verl.evaluation.cli:main", "avg@k / pass@k / maj@k per benchmark from validation generations"),
    "compare": ("tepo_verl.report.compare:main", "compare algorithms from verl file-logger runs (table, plots)"),
    "tiny": ("tepo_verl.tiny.__main__:main", "build the tiny offline model and task used on CPU"),
    "cpu-check": ("tepo_verl.cpu.versions:main", "check the pinned versions of the CPU stack"),
    "doctor": ("tepo_verl.report.doctor:main", "read one run; one line per health check, each with its fix"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: tepo-verl COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tepo-verl: unknown command {name!r}; valid: {', '.join(COMMANDS)}\n\n{usage()}", file=sys.stderr)
        return 2
    module, function = COMMANDS[name][0].split(":")
    try:
        return int(getattr(importlib.import_module(module), function)(rest) or 0)
    except KeyboardInterrupt:
        print(f"tepo-verl {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the last guard: one line, never a traceback
        if os.environ.get("TEPO_VERL_DEBUG") == "1":
            raise
        first = (str(error).strip().splitlines() or [""])[0]
        print(f"tepo-verl {name}: error: {type(error).__name__}: {first} (TEPO_VERL_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
