"""`tepo-verl COMMAND ...`: one entry point for the project's tools (each is also `python -m MODULE`)."""

from __future__ import annotations

import importlib
import sys

#: command -> (module:function taking argv, one-line help)
COMMANDS = {
    "data": ("tepo_verl.data.cli:main", "convert maths data sets to verl parquet; contamination check"),
    "eval": ("tepo_verl.evaluation.cli:main", "avg@k / pass@k / maj@k per benchmark from validation generations"),
    "compare": ("tepo_verl.report.compare:main", "compare algorithms from verl file-logger runs (table, plots)"),
    "tiny": ("tepo_verl.tiny.__main__:main", "build the tiny offline model and task used on CPU"),
    "cpu-check": ("tepo_verl.cpu.versions:main", "check the pinned versions of the CPU stack"),
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
    return int(getattr(importlib.import_module(module), function)(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
