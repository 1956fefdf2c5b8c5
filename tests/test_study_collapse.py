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
REPO = Path(__file__).resolve().parents[1]


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
  h=$(awk "BEGIN { print 0.2 * (1 - (1 - $share) * ($step - 1) / ($STEPS > 1 ? $STEPS - 1 : 1)) }")
  acc=$(awk "BEGIN { print 0.2 + 0.05 * $step }")
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


# ---- the comparison in the calibrated regime (MASK_COLLAPSE) -------------------------------------------------------

MASK_COLLAPSE = study.MASK_COLLAPSE


def _calibrated(results: Path) -> None:
    """Calibration runs whose procedure ends at epochs4 (lr3e-4 missed on grpo)."""
    _run(results, "lr3e-4-grpo-seed1", KEPT, LEARNED)
    _run(results, "epochs4-grpo-seed1", COLLAPSED, LEARNED)
    _run(results, "epochs4-tepo_nomask-seed1", COLLAPSED, LEARNED)


def test_the_comparison_has_no_arm_until_the_calibration_meets_a_level(tmp_path, capsys):
    _run(tmp_path, "lr3e-4-grpo-seed1", KEPT, LEARNED)
    _run(tmp_path, "epochs4-grpo-seed1", COLLAPSED, LEARNED)
    assert study.calibrated_level(tmp_path, STEPS) is None
    _run(tmp_path, "epochs4-tepo_nomask-seed1", COLLAPSED, NEVER_LEARNED)  # tepo_nomask diverged: not met
    assert study.calibrated_level(tmp_path, STEPS) is None
    # with nothing calibrated the runner refuses in one line naming where the calibration stands
    assert study.main(["--study", MASK_COLLAPSE.name, "--results-root", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has found none: in progress, 0 of at most 6 runs" in err
    assert study.main(["--study", MASK_COLLAPSE.name, "--results-root", str(tmp_path / "empty"), "--list"]) == 0


def test_the_comparison_runs_in_the_met_level_and_shares_the_calibrations_seed_1(tmp_path):
    _calibrated(tmp_path)
    level = study.calibrated_level(tmp_path, STEPS)
    assert level.name == "epochs4"
    compared = study.mask_collapse_study(level)
    assert {arm.name: (arm.preset, arm.overrides, compared.seeds[arm.group]) for arm in compared.arms} == {
        "epochs4-tepo": ("tepo", level.overrides, tuple(range(1, 11))),
        "epochs4-tepo_nomask": ("tepo_nomask", level.overrides, tuple(range(1, 11))),
        "epochs4-grpo": ("grpo", level.overrides, (1, 2, 3, 4, 5))}
    assert compared.results_name == COLLAPSE.results_name and compared.regime == study.CHAIN.regime
    # the calibration's seed-1 run is the comparison's: the same folder and the same command
    calibration_arm = next(arm for arm in COLLAPSE.arms if arm.name == "epochs4-grpo")
    comparison_arm = next(arm for arm in compared.arms if arm.name == "epochs4-grpo")
    recipe = Path("recipes/cpu.sh")
    assert (study.command_for(study.Run(calibration_arm, 1), COLLAPSE.regime, recipe, COLLAPSE)
            == study.command_for(study.Run(comparison_arm, 1), compared.regime, recipe, compared))
    runs = study.plan(list(compared.arms), None, compared)  # seed-major
    assert [(run.arm.name, run.seed) for run in runs[:4]] == [
        ("epochs4-tepo", 1), ("epochs4-tepo_nomask", 1), ("epochs4-grpo", 1), ("epochs4-tepo", 2)]
    assert len(runs) == 25 and [run.name for run in runs if study.finished(tmp_path / run.name, STEPS)] == [
        "epochs4-tepo_nomask-seed1", "epochs4-grpo-seed1"]
    assert [(c.reference, c.arm, c.metric) for c in compared.contrasts] == [
        ("epochs4-tepo", "epochs4-tepo_nomask", study.RETENTION), ("epochs4-tepo", "epochs4-tepo_nomask", "val_auc")]


def test_entropy_retention_is_the_last_steps_entropy_over_the_firsts(tmp_path):
    header = "algorithm,seed,entropy_start,entropy_end,val_auc\n"
    (tmp_path / "compare_runs.csv").write_text(header + "a,1,0.2,0.05,0.3\na,2,0.25,0.2,0.31\nb,1,,,0.2\n")
    assert study.per_seed(tmp_path, study.RETENTION) == {"a": {1: 0.25, 2: 0.8}}
    assert study.per_seed(tmp_path) == {"a": {1: 0.3, 2: 0.31}, "b": {1: 0.2}}


SEEDS = range(1, 11)
UP, MIXED, DOWN = [0.1] * 10, [0.1, -0.1] * 5, [-0.1] * 10


@pytest.mark.parametrize("keep, learn, verdict", [
    (UP, UP, "The mask prevents collapse and helps there"),
    (UP, MIXED, "The mask keeps the entropy up without a measured gain"),
    (UP, DOWN, "The mask hurts learning there"),
    (MIXED, DOWN, "The mask hurts learning there"),
    (MIXED, UP, "The mask is not shown to change the collapse on this test bed"),
    (DOWN, MIXED, "The mask is not shown to change the collapse on this test bed"),
    (MIXED, MIXED, "The mask is not shown to change the collapse on this test bed"),
])
def test_the_decision_rule(keep, learn, verdict):
    compared = study.mask_collapse_study(study.COLLAPSE_LEVELS[0])
    tepo, nomask = compared.contrasts[0].reference, compared.contrasts[0].arm
    values = {study.RETENTION: {tepo: {s: 0.5 + d for s, d in enumerate(keep, 1)}, nomask: dict.fromkeys(SEEDS, 0.5)},
              "val_auc": {tepo: {s: 0.3 + d for s, d in enumerate(learn, 1)}, nomask: dict.fromkeys(SEEDS, 0.3)}}
    calls = study.contrast_calls(values, compared)
    assert [call.planned for call in calls] == [10, 10]
    # ten seeds of one sign: exact sign-flip p = 2 / 2**10, which Holm's rule over two rejects
    assert all(call.word == ("supported" if len(set(diffs)) == 1 else "null")
               for call, diffs in zip(calls, (keep, learn), strict=True))
    lines = study.mask_collapse_decisions(calls)
    assert lines[0].startswith(f"- **{verdict}**: entropy kept, `{tepo}` minus `{nomask}`: ")
    pending = {metric: {arm: dict(list(seeds.items())[:9]) for arm, seeds in of.items()}
               for metric, of in values.items()}
    assert study.mask_collapse_decisions(study.contrast_calls(pending, compared))[0].startswith(
        "- **Pending**: 9 of 10 paired seeds")



def test_the_page_states_the_plan_the_code_applies():
    page = " ".join((REPO / "docs" / "results.md").read_text(encoding="utf-8").split())
    plan = page.split("## Where entropy collapses: does the mask prevent it?")[1].split("### Results")[0]
    assert "`tepo` and `tepo_nomask` (the mask ablation: the same loss with `mask_rule=off`), 10 seeds each" in plan
    assert "`grpo`, 5 seeds (1-5)" in plan
    assert ("1. on entropy retention: does the mask keep the entropy up; 2. on `val_auc`: does it learn better."
            in plan)
    assert (f"the smaller p at most {study.CONTRAST_ALPHA / 2:g}, the other then at most {study.CONTRAST_ALPHA:g}"
            in plan)
    compared = study.mask_collapse_study(study.COLLAPSE_LEVELS[0])
    assert [c.question for c in compared.contrasts] == ["does the mask keep the entropy up", "does it learn better"]
    assert (MASK_COLLAPSE.page_begin in page) and (MASK_COLLAPSE.page_end in page)


def test_the_runner_runs_the_comparison_from_the_calibrated_level_and_the_page_calls_it(tmp_path, monkeypatch):
    """The calibration's runs (by the stand-in recipe, epochs4 collapses), then the comparison's other 23 runs and
    its page section: tepo and tepo_nomask identical under the stand-in, so both contrasts are nulls."""
    recipe, log, page = tmp_path / "fake.sh", tmp_path / "calls.log", tmp_path / "page.md"
    recipe.write_text(FAKE)
    page.write_text(f"{MASK_COLLAPSE.page_begin}\nNo run yet.\n{MASK_COLLAPSE.page_end}\n")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_COLLAPSE_ARG", "ppo_epochs=4")
    for name in ("COLLAPSE", "MASK_COLLAPSE"):
        short = study.dataclasses.replace(getattr(study, name), regime={**COLLAPSE.regime, "STEPS": str(STEPS)})
        monkeypatch.setattr(study, name, short)
        monkeypatch.setitem(study.STUDIES, short.name, short)
    common = ["--results-root", str(tmp_path / "results"), "--scratch-root", str(tmp_path / "scratch"),
              "--recipe", str(recipe), "--page-file", str(page), "--no-plots"]
    assert study.main(["--study", COLLAPSE.name, "--no-compare", *common], log=lambda *_: None) == 0
    assert study.main(["--study", MASK_COLLAPSE.name, *common], log=lambda *_: None) == 0
    calls = [line.split(" ", 1)[0] for line in log.read_text().splitlines()]
    assert len(calls) == 3 + 23 and sorted(calls[3:]) == ["grpo"] * 4 + ["tepo"] * 10 + ["tepo_nomask"] * 9
    text = page.read_text()
    assert ("**The calibration's criterion on each finished seed** (entropy at the last step at most 0.5 of the "
            "first step's, after learning): `epochs4-tepo` 10 of 10, `epochs4-tepo_nomask` 10 of 10, "
            "`epochs4-grpo` 5 of 5.") in text
    assert "| does the mask keep the entropy up | entropy_retention | epochs4-tepo | epochs4-tepo_nomask | 10 of 10 |" \
           in text
    assert "- **The mask is not shown to change the collapse on this test bed**: entropy kept, " in text


def test_the_comparisons_part_of_the_page_waits_then_says_it_did_not_run(tmp_path, monkeypatch):
    """While the calibration runs, the comparison's part of the page says it waits; once the calibration is over
    without a level, it says the comparison did not run and why (no level was met), from the committed runs."""
    short = study.dataclasses.replace(MASK_COLLAPSE, regime={**COLLAPSE.regime, "STEPS": str(STEPS)})
    monkeypatch.setattr(study, "MASK_COLLAPSE", short)
    results, page = tmp_path / "results", tmp_path / "page.md"
    page.write_text(f"before\n{short.page_begin}\nold words\n{short.page_end}\nafter\n")

    def part() -> str:
        study.write_page(results, [short], page, log=lambda *_: None, plots=False)
        text = page.read_text()
        assert text.startswith("before\n") and text.endswith("\nafter\n")
        return text.split(short.page_begin)[1].split(short.page_end)[0].strip()

    folder = results / COLLAPSE.results_name
    _run(folder, "lr3e-4-grpo-seed1", KEPT, LEARNED)
    assert part() == ("No run yet: the comparison waits for the calibration above (in progress, 1 of at most 6 "
                      "runs; next epochs4-grpo-seed1).")
    _run(folder, "epochs4-grpo-seed1", COLLAPSED, NEVER_LEARNED)
    _run(folder, "lr3e-4-epochs4-grpo-seed1", KEPT, NEVER_LEARNED)
    words = part()
    assert words.startswith("**Not run**: the calibration above is over and met no level (not reached: none of "
                            "the 3 levels met the criterion). As this plan says,")
    assert "no run with the mask was made" in words
