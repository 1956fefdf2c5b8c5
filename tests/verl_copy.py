"""A copy of the installed verl with some of its source changed, put first on the path of a subprocess: the changed
verl that process imports, for changes that cannot be planted into one module of the running process (a class other
modules import, such as verl's Metric) and for what the plugin does when it loads."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import fresh_python

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def copy_of_verl(root: Path, replacements: dict[str, list[tuple[str, str]]] | None = None,
                 patches: tuple[Path, ...] = ()) -> Path:
    """Copy the installed verl package to root/verl, replace text in its modules (each `old` must occur once) and
    apply `git diff` patches to it; return root, the directory to put first on sys.path."""
    installed = Path(list(importlib.util.find_spec("verl").submodule_search_locations)[0])
    shutil.copytree(installed, root / "verl")  # with its bytecode, valid for the files left unchanged
    for module, pairs in (replacements or {}).items():
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        text = path.read_text(encoding="utf-8")
        for old, new in pairs:
            assert text.count(old) == 1, f"the change no longer matches the installed verl's {module}: {old!r}"
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    for patch in patches:
        subprocess.run(["git", "apply", "-p1", str(patch)], cwd=root, check=True, capture_output=True, text=True)
    return root


def run_with_verl(root: Path, args: list[str], *, env: dict[str, str] | None = None, cwd: Path,
                  timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python ARGS` (["-c", code] or ["-m", module, ...]) with the verl copy at root first on the path, then this
    repository and tests/; without TEPO_VERL_CONTRACT unless `env` sets it."""
    base = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TEPO_VERL_CONTRACT")}
    path = os.pathsep.join(filter(None, [str(root), str(REPO), str(TESTS), os.environ.get("PYTHONPATH")]))
    return fresh_python.run(args, timeout=timeout, cwd=cwd, env={**base, **(env or {}), "PYTHONPATH": path})
