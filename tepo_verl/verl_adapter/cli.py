"""Make `python -m verl.trainer.main_ppo algorithm=tepo` work with the stock verl entry point.

verl's primary config already has an `algorithm` node (and uses the `algorithm` config group only under the
package `algorithm.rollout_correction`), so Hydra reads `algorithm=tepo` as "set the node algorithm to the
string 'tepo'" and fails ("Could not override 'algorithm'"). Hydra's spelling for adding a config group option
that is not in the defaults list is `+algorithm=tepo`, which works once our search-path plugin
(hydra_plugins/tepo_verl_searchpath) adds the `algorithm/` presets. When the plugin loads in the driver of a
verl command (during `import verl`, before Hydra parses the command line), `normalize_algorithm_override`
rewrites the exact token `algorithm=NAME` into `+algorithm=NAME`. An unknown NAME then gets Hydra's own error
listing the available presets. Set TEPO_VERL_REWRITE_ARGV=0 to turn the rewrite off. No other token, and no other
process's command line, is changed (docs/plugin.md, "What the plugin changes in verl at run time").
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

_ALGORITHM_OVERRIDE = re.compile(r"^algorithm=([A-Za-z_][A-Za-z0-9_]*)$")


def normalize_algorithm_override(argv: list[str]) -> list[str]:
    """`algorithm=NAME` -> `+algorithm=NAME`; every other token unchanged."""
    return ["+" + arg if _ALGORITHM_OVERRIDE.match(arg) else arg for arg in argv]


def is_verl_command(orig_argv: list[str], argv0: str) -> bool:
    """True for `python -m verl....` and for a script that lives inside the installed verl package."""
    for position, arg in enumerate(orig_argv[:-1]):
        if arg == "-m":
            return orig_argv[position + 1].startswith("verl.")
    import verl

    verl_dir = Path(verl.__file__).resolve().parent
    try:
        return argv0 not in ("", "-c", "-m") and verl_dir in Path(argv0).resolve().parents
    except OSError:
        return False


def rewrite_sys_argv() -> None:
    if os.environ.get("TEPO_VERL_REWRITE_ARGV", "1") == "0":
        return
    if not is_verl_command(list(getattr(sys, "orig_argv", [])), sys.argv[0] if sys.argv else ""):
        return
    sys.argv[1:] = normalize_algorithm_override(sys.argv[1:])
