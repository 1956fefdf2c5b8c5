"""The collapse calibration's procedure as code (benchmarks/study.py, COLLAPSE): the criterion on a run, the levels
in order with grpo screened first, the budget, and the runner choosing each run from the finished ones, with a
stand-in recipe (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from study_module import load_study

from tepo_verl.report.runs import ENTROPY

study = load_study()
COLLAPSE = study.COLLAPSE

VAL = "val-core/tepo_tiny_chain/acc/mean@1"
STEPS = 3


def _run(results: Path, name: str, entropy: list[float], accuracy: list[float]) -> None:
    """A finished run of STEPS steps: `entropy` at steps 1..STEPS (verl logs none before training), `accuracy` at
    steps 0..STEPS."""
    folder = results / name
    folder.mkdir(parents=True)
    lines = [{"step": 0, "data": {VAL: accuracy[0]}}]
    lines += [{"step": step, "data": {ENTROPY: h, VAL: acc}}
              for step, h, acc in zip(range(1, STEPS + 1), entropy, accuracy[1:])]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (folder / "run.json").write_text(json.dumps({"status": "finished", "regime": {"STEPS": str(STEPS)}}))


COLLAPSED = [0.2, 0.15, 0.1]  # step 3 at exactly half of step 1: meets the entropy part (at most half)
KEPT = [0.2, 0.18, 0.101]  # just above half
LEARNED = [0.2, 0.22, 0.26, 0.24]  # best 0.26, 0.06 above the start: meets the learning part
NEVER_LEARNED = [0.2, 0.0, 0.0, 0.0]  # a divergence, as the 1e-3 probe's


@pytest.mark.parametrize("entropy, accuracy, met", [
    (COLLAPSED, LEARNED, True), (KEPT, LEARNED, False), (COLLAPSED, NEVER_LEARNED, False),
    (COLLAPSED, [0.2, 0.22, 0.249, 0.24], False),  # learned 0.049: short of the margin
])
def test_the_criterion_on_one_run(tmp_path, entropy, accuracy, met):
    _run(tmp_path, "lr3e-4-grpo-seed1", entropy, accuracy)
    check = study.collapse_check(tmp_path / "lr3e-4-grpo-seed1", STEPS)
    assert (check.entropy_first, check.entropy_last, check.val_start, check.val_best) == (
        entropy[0], entropy[-1], accuracy[0], max(accuracy))
    assert check.met is met


def _state(results: Path):
    run, checks, state = study.collapse_state(results, STEPS)
    return (run.name if run else None), [c.run for c in checks], state


def test_the_levels_in_order_grpo_first_and_tepo_nomask_only_where_grpo_met_it(tmp_path):
    assert _state(tmp_path)[0] == "lr3e-4-grpo-seed1"
    _run(tmp_path, "lr3e-4-grpo-seed1", KEPT, LEARNED)  # grpo misses: the level is left without tepo_nomask
    assert _state(tmp_path)[0] == "epochs4-grpo-seed1"
    _run(tmp_path, "epochs4-grpo-seed1", COLLAPSED, LEARNED)
    assert _state(tmp_path)[0] == "epochs4-tepo_nomask-seed1"
    _run(tmp_path, "epochs4-tepo_nomask-seed1", COLLAPSED, LEARNED)
    assert _state(tmp_path) == (None, ["lr3e-4-grpo-seed1", "epochs4-grpo-seed1", "epochs4-tepo_nomask-seed1"],
                                "calibrated: level epochs4 met the criterion on grpo and tepo_nomask")


def test_a_level_needs_both_arms_and_no_level_met_is_said(tmp_path):
    for level in ("lr3e-4", "epochs4", "lr3e-4-epochs4"):
        _run(tmp_path, f"{level}-grpo-seed1", COLLAPSED, LEARNED)
        assert _state(tmp_path)[0] == f"{level}-tepo_nomask-seed1"
        _run(tmp_path, f"{level}-tepo_nomask-seed1", COLLAPSED, NEVER_LEARNED)
    run, checks, state = _state(tmp_path)
    assert run is None and len(checks) == 6 and state == "not reached: none of the 3 levels met the criterion"


def test_the_budget_ends_the_calibration(tmp_path, monkeypatch):
    monkeypatch.setattr(study, "COLLAPSE_BUDGET", 2)
    _run(tmp_path, "lr3e-4-grpo-seed1", COLLAPSED, LEARNED)
    _run(tmp_path, "lr3e-4-tepo_nomask-seed1", KEPT, LEARNED)
    assert _state(tmp_path) == (None, ["lr3e-4-grpo-seed1", "lr3e-4-tepo_nomask-seed1"],
                                "not reached: no level met the criterion within the budget of 2 runs")


def test_the_calibration_runs_no_arm_with_the_mask():
    assert {arm.preset for arm in COLLAPSE.arms} == {"grpo", "tepo_nomask"}
    assert len(COLLAPSE.arms) == 2 * len(study.COLLAPSE_LEVELS) <= study.COLLAPSE_BUDGET


#: Stands in for recipes/cpu.sh: logs ALGO and its arguments, then writes STEPS steps whose validation rises 0.05 a
#: step and whose entropy halves over the run where an argument contains $FAKE_COLLAPSE_ARG (else stays).
FAKE = r"""#!/usr/bin/env bash
set -euo pipefail
echo "$ALGO $*" >> "$FAKE_LOG"
share=1.0; if [[ "$*" == *"$FAKE_COLLAPSE_ARG"* ]]; then share=0.5; fi
echo "{\"step\": 0, \"data\": {\"VAL\": 0.2}}" >> "$RUN_DIR/metrics.jsonl"
for ((step = 1; step <= STEPS; step++)); do
  h=$(python -c "print(0.2 * (1 - (1 - $share) * ($step - 1) / max(1, $STEPS - 1)))")
  acc=$(python -c "print(0.2 + 0.05 * $step)")
  echo "{\"step\": $step, \"data\": {\"ENTROPY\": $h, \"VAL\": $acc}}" >> "$RUN_DIR/metrics.jsonl"
done
""".replace("ENTROPY", ENTROPY).replace("VAL", VAL)


def test_the_runner_chooses_each_run_from_the_finished_ones_and_the_page_says_where_it_ended(tmp_path, monkeypatch):
    recipe, log, page = tmp_path / "fake.sh", tmp_path / "calls.log", tmp_path / "page.md"
    recipe.write_text(FAKE)
    page.write_text(f"{COLLAPSE.page_begin}\nNo calibration run yet.\n{COLLAPSE.page_end}\n")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_COLLAPSE_ARG", "ppo_epochs=4")  # the epochs4 level collapses; lr3e-4 alone does not
    short = study.dataclasses.replace(COLLAPSE, regime={**COLLAPSE.regime, "STEPS": str(STEPS)})  # runs and page
    monkeypatch.setattr(study, "COLLAPSE", short)
    monkeypatch.setitem(study.STUDIES, short.name, short)
    results = tmp_path / "results"
    code = study.main(["--study", COLLAPSE.name, "--results-root", str(results),
                       "--scratch-root", str(tmp_path / "scratch"), "--recipe", str(recipe), "--page-file", str(page),
                       "--no-plots"], log=lambda *_: None)
    assert code == 0
    calls = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert [algo for algo, _ in calls] == ["grpo", "grpo", "tepo_nomask"]
    assert "optim.lr=0.0003" in calls[0][1] and "ppo_epochs" not in calls[0][1]
    assert all("ppo_epochs=4" in args and "optim.lr=0.0003" not in args for _, args in calls[1:])
    assert sorted(path.name for path in (results / COLLAPSE.name).glob("*-seed1")) == [
        "epochs4-grpo-seed1", "epochs4-tepo_nomask-seed1", "lr3e-4-grpo-seed1"]
    text = page.read_text()
    assert "calibrated: level epochs4 met the criterion on grpo and tepo_nomask." in text
    assert "| epochs4-tepo_nomask-seed1 | 0.2000 | 0.1000 | 0.500 | 0.2000 | 0.3500 | met |" in text
    assert "| lr3e-4-grpo-seed1 | 0.2000 | 0.2000 | 1.000 | 0.2000 | 0.3500 | missed |" in text
    # a second start has nothing left to run
    assert study.main(["--study", COLLAPSE.name, "--results-root", str(results),
                       "--scratch-root", str(tmp_path / "scratch"), "--recipe", str(recipe), "--no-compare"],
                      log=lambda *_: None) == 0
    assert len(log.read_text().splitlines()) == 3


def test_the_calibration_takes_no_arm_or_seed_choice(capsys):
    assert study.main(["--study", COLLAPSE.name, "--seeds", "2", "--list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "chooses its runs by its procedure" in err and "--seeds 2" in err
