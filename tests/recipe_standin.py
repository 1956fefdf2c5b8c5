"""recipes/cpu.sh run for real with a stand-in interpreter ($PYTHON), so a test sees what the recipe does around verl
without starting a training (a plain module, imported as `recipe_standin` after putting this folder on sys.path).

The stand-in plays three calls and hands every other one to the real interpreter:
- `-m verl.trainer.main_ppo ARGS`: writes ARGS, one a line, to $STANDIN_VERL_ARGS, prints VERL_CHATTER numbered lines
  as verl's console would, and, when $STANDIN_VERL_FAIL is set, ends like a failed verl start-up: a traceback whose
  last line is `ConnectionError: $STANDIN_VERL_FAIL` (on stderr), exit 1;
- `-m tepo_lab.cpu.versions`: the tested stack is installed (exit 0);
- `-m tepo_lab.tiny ...`: prints $STANDIN_TINY_DIR, as `tiny build --print dir` prints the build folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Lines of console output the stand-in verl prints before it ends.
VERL_CHATTER = 200

STANDIN = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    case "${1:-} ${2:-}" in
      "-m verl.trainer.main_ppo")
        shift 2
        printf '%s\\n' "$@" > "$STANDIN_VERL_ARGS"
        for i in $(seq 1 @CHATTER@); do echo "(TaskRunnerV1 pid=1) verl console line $i"; done
        if [[ -n "${STANDIN_VERL_FAIL:-}" ]]; then
          { echo "Traceback (most recent call last):"; echo '  File "ray/_private/worker.py", in connect';
             echo "ConnectionError: $STANDIN_VERL_FAIL"; } >&2
          exit 1
        fi
        exit 0 ;;
      "-m tepo_lab.cpu.versions") exit 0 ;;
      "-m tepo_lab.tiny") echo "$STANDIN_TINY_DIR"; exit 0 ;;
    esac
    exec "$STANDIN_REAL_PYTHON" "$@"
    """
).replace("@CHATTER@", str(VERL_CHATTER))


def run_cpu_recipe(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """`bash recipes/cpu.sh ARGS` with the stand-in interpreter and `env` (on top of this process's environment,
    without the variables the recipe reads from it); returns the finished process (stdout and stderr apart) and the
    arguments verl got (None when the recipe never started it)."""
    standin = tmp_path / "standin-python"
    standin.write_text(STANDIN)
    standin.chmod(0o755)
    verl_args = tmp_path / "verl-args.txt"
    read_by_the_recipe = ("ALGO", "STEPS", "SEED", "RUNS_ROOT", "RUN_DIR", "TEST_FREQ", "MINI", "TASK", "TINY_DIR",
                          "N", "BATCH", "LR", "PRECISION", "DRY_RUN", "QUIET", "COMPARE", "RAY_ADDRESS",
                          "VERL_FILE_LOGGER_PATH")
    full_env = {k: v for k, v in os.environ.items() if k not in read_by_the_recipe} | {
        "PYTHON": str(standin), "STANDIN_REAL_PYTHON": sys.executable, "STANDIN_VERL_ARGS": str(verl_args),
        "STANDIN_TINY_DIR": str(tmp_path / "tiny"), "COMPARE": "0", **env}
    proc = subprocess.run(["bash", str(REPO / "recipes" / "cpu.sh"), *args], env=full_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    return proc, verl_args.read_text().splitlines() if verl_args.exists() else None
