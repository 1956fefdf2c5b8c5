"""benchmarks/step_cost.py: its interval, its arguments, and one short run of its in-process engine mode in verl's
real TrainingWorker."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import conftest_e2e
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

_spec = importlib.util.spec_from_file_location("step_cost", REPO / "benchmarks" / "step_cost.py")
step_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_cost)


def test_the_ratio_interval_is_a_t_interval_of_the_paired_log_ratios():
    reference = [2.0, 3.0, 2.5, 4.0]
    assert step_cost.ratio_interval([1.1 * r for r in reference], reference) == pytest.approx((1.1, 1.1, 1.1))
    rng = np.random.default_rng(0)
    base = rng.uniform(1, 2, 200)
    values = base * 1.03 * np.exp(rng.normal(0, 0.05, 200))  # a 3% cost in multiplicative noise
    ratio, low, high = step_cost.ratio_interval(list(values), list(base))
    assert low < 1.03 < high and low < ratio < high
    assert math.log(ratio) - math.log(low) == pytest.approx(math.log(high) - math.log(ratio))  # symmetric in logs
    assert high - low < 0.02  # 200 pairs at 5% noise resolve a few percent


@pytest.mark.parametrize("argv, message", [
    (["--min-rounds", "1"], "--min-rounds must be >= 2"),
    (["--extra", "tepo:a=b"], "--extra applies to --trainer runs only"),
    (["--trainer", "--steps", "1"], "--steps must be >= 2"),
    (["--mask-rule", "entropy"], "invalid choice: 'entropy'"),
])
def test_step_cost_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        step_cost.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.e2e
def test_step_cost_engine_mode_runs_interleaved_updates_from_one_start(tmp_path):
    """Two rounds of TEPO and GSPO updates in verl's real TrainingWorker (under a minute on 2 cores)."""
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
    # on a CPU the actor computes in float32 (as recipes/cpu.sh): its log-probs reach the loss unrounded
    assert conftest_e2e.PRECISION_WARNING not in proc.stdout + proc.stderr
    record = json.loads((tmp_path / "step_cost_engine.json").read_text())
    assert record["rounds"] == 2 and record["timed"] == "cpu" and record["precision"] == "float32"
    assert all(len(record["per_update"][p]["cpu"]) == 2 for p in ("tepo", "gspo"))
