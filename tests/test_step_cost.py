"""benchmarks/step_cost.py: its interval and its arguments (its run in verl's real TrainingWorker is
tests/test_e2e_step_cost.py)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

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

