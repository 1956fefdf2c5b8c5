"""Helpers for the end-to-end tests of verl's real trainer on CPU (a plain module, imported as `conftest_e2e`
after putting this folder on sys.path, like conftest_data).

`require_cpu_stack()` skips with the reason on a machine without the tested CPU stack, and FAILS under CI=true:
CI installs the stack, so a missing or mismatched one is a bug there, never a reason to test less. (Whether the
plugin loads the CPU mode is the product's behaviour, not a prerequisite: tests/test_cpu_mode.py checks it, and the
trainer runs fail without it.) `run_recipe()` runs recipes/cpu.sh and returns what verl logged.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_data import in_ci, skip_or_fail  # noqa: F401  (one rule for every prerequisite: skip here, fail in CI)

REPO = Path(__file__).resolve().parents[1]


def cpu_stack_problem() -> str | None:
    """Why verl's trainer cannot run on this machine's CPU (None when it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (install the CPU stack: bash lab/tepo_lab/cpu/install_cpu.sh)"
    if importlib.util.find_spec("verl") is None:
        return "verl is not installed"
    from tepo_lab.cpu.versions import mismatches

    bad = mismatches()
    if bad:
        return "the tested CPU stack is not installed: " + "; ".join(bad)
    return None


def require_cpu_stack() -> None:
    problem = cpu_stack_problem()
    if problem is not None:
        skip_or_fail(problem)


def metric(data: dict, name: str):
    """A logged value by its name with or without verl's `actor/` worker prefix (None when absent)."""
    for key in (name, f"actor/{name}"):
        if key in data:
            return data[key]
    return None


def assert_step_updated(data: dict, step: int) -> None:
    """One logged training step of a loss whose token ratios clip at 0.2 (first mini-batch on-policy): a finite loss,
    and a non-zero gradient whenever the batch held a response with a non-zero advantage (a group whose rewards
    differ). A step whose groups all got equal rewards gives the policy term nothing to learn from, so its gradient
    may be 0; that is the data, not a broken update."""
    assert math.isfinite(metric(data, "pg_loss")), step
    informative = data["critic/advantages/max"] > 0 or data["critic/advantages/min"] < 0
    assert metric(data, "grad_norm") > 0 or not informative, (step, metric(data, "grad_norm"))


@contextlib.contextmanager
def training_lock():
    """Hold an exclusive flock on $TEPO_TRAIN_LOCK (when set) while a training runs, so that the tests never train
    beside another training on a shared machine (benchmarks/study.py --lock takes the same flock)."""
    path = os.environ.get("TEPO_TRAIN_LOCK")
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def composed_config(run_dir: Path, console: str):
    """The config the trainer ran with, as Hydra saved it (run_dir/outputs/<date>/<time>/.hydra/config.yaml; the
    newest when the folder holds several runs). Read from the file, not from verl's printout of it in the console,
    which Ray's log streaming can split in the middle of a `'key': value` pair."""
    from omegaconf import OmegaConf

    saved = sorted(run_dir.glob("outputs/*/*/.hydra/config.yaml"))
    if not saved:
        pytest.fail(f"Hydra saved no config under {run_dir}/outputs:\n{console[-3000:]}", pytrace=False)
    return OmegaConf.load(saved[-1])


def run_recipe(run_dir: Path, algo: str, steps: int, *overrides: str, **env: str) -> dict:
    """`ALGO=algo STEPS=steps bash recipes/cpu.sh overrides...` into run_dir; returns its console, composed config
    and records.

    The console goes to run_dir/pytest-console.log too. Fails the calling test with the end of the console when
    the recipe fails or the file logger wrote nothing.
    """
    full_env = {**os.environ, "ALGO": algo, "STEPS": str(steps), "RUN_DIR": str(run_dir), "PYTHON": sys.executable,
                "COMPARE": "0", **env}
    full_env.pop("VERL_FILE_LOGGER_PATH", None)
    with training_lock():
        proc = subprocess.run(
            ["bash", str(REPO / "recipes" / "cpu.sh"), *overrides], env=full_env, cwd=REPO, capture_output=True,
            text=True, timeout=int(os.environ.get("TEPO_E2E_TIMEOUT", "900")),
        )
    console = proc.stdout + proc.stderr
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "pytest-console.log").write_text(console)
    if proc.returncode != 0:
        pytest.fail(f"recipes/cpu.sh ALGO={algo} failed (rc={proc.returncode}):\n{console[-6000:]}", pytrace=False)
    jsonl = run_dir / "metrics.jsonl"
    if not jsonl.exists():
        pytest.fail(f"verl's file logger wrote nothing at {jsonl}:\n{console[-3000:]}", pytrace=False)
    logged = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    return {
        "dir": run_dir,
        "console": console,
        "config": composed_config(run_dir, console),
        "logged": logged,
        "by_step": {record["step"]: record["data"] for record in logged},
        "records": [record for record in logged if record["step"] >= 1],  # step 0: validation before training
    }
