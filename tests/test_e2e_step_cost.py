"""End to end: one short run of benchmarks/step_cost.py's in-process engine mode in verl's real TrainingWorker on CPU.

An end-to-end file (test_e2e_*), so that `make test` runs it on the worker that runs the trainer runs, one at a time,
instead of beside them (tests/conftest.py). Marked `e2e`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import conftest_e2e
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_step_cost_engine_mode_runs_interleaved_updates_from_one_start(tmp_path):
    """Two rounds of TEPO and GSPO updates in verl's real TrainingWorker (about 1-2 minutes on 2 cores)."""
    conftest_e2e.require_cpu_stack()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with conftest_e2e.training_lock():
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "step_cost.py"), "--presets", "tepo", "gspo",
                               "--budget-s", "0", "--min-rounds", "2", "--out", str(tmp_path)],
                              capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"update_actor tepo/gspo time=\d+\.\d{3} memory=\d+\.\d{3}", lines[-1]), lines[-1]
    assert any("restoring the start: two updates from it agree to 0.0e+00" in line for line in lines)
    record = json.loads((tmp_path / "step_cost_engine.json").read_text())
    assert record["rounds"] == 2 and record["timed"] == "cpu"
    assert all(len(record["per_update"][p]["cpu"]) == 2 for p in ("tepo", "gspo"))
