"""`tepo-lab COMMAND ...`: the lab's tools (each is also `python -m MODULE`), dispatched as `tepo-verl`'s are."""

from __future__ import annotations

import sys

from tepo_verl.cli import dispatch

#: command -> (module:function taking argv, one-line help)
COMMANDS = {
    "demo": ("tepo_lab.demo:main", "TEPO vs GRPO vs DAPO through verl's real trainer on CPU, then the comparison"),
    "tiny": ("tepo_lab.tiny.__main__:main", "build the tiny offline model and task used on CPU"),
    "cpu-check": ("tepo_lab.cpu.versions:main", "check the pinned CPU stack and that verl loads the CPU mode"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("tepo-lab", COMMANDS, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
