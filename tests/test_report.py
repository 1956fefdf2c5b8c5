"""The comparison report on synthetic verl file-logger runs with known curves, and the preset-difference table
of docs/presets.md against the composed presets."""

from __future__ import annotations

import gzip
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from tepo_verl import cli
from tepo_verl.report.compare import (
    CONFIDENCE,
    auto_target,
    bootstrap_ci,
    default_reference,
    main,
    p_value_floor,
    paired_differences,
    per_run_table,
    sign_flip_p,
    step_ratios,
    steps_to_target,
    summarize,
    val_auc,
)
from tepo_verl.report.runs import RunError, default_label, load_runs, metrics_file

PRESETS_DOC = Path(__file__).resolve().parents[1] / "docs" / "presets.md"
PRESETS = ["tepo", "tepo_nomask", "gspo", "grpo", "dapo", "gmpo", "kl_cov", "dr_grpo", "cispo", "sapo", "clip_cov"]

VAL = {  # label, seed -> validation accuracy at steps 0, 5, 10, 15, 20 (target 0.5 in the tests)
    ("tepo", 1): [0.1, 0.3, 0.5, 0.6, 0.6],  # reaches 0.5 at step 10
    ("tepo", 2): [0.1, 0.2, 0.5, 0.55, 0.7],  # 10
    ("tepo", 3): [0.1, 0.5, 0.5, 0.6, 0.6],  # 5
    ("grpo", 1): [0.1, 0.2, 0.3, 0.5, 0.5],  # 15
    ("grpo", 2): [0.1, 0.2, 0.4, 0.45, 0.5],  # 20
    ("grpo", 3): [0.1, 0.3, 0.5, 0.5, 0.5],  # 10
    ("dapo", 1): [0.1, 0.2, 0.5, 0.5, 0.6],  # 10
    ("dapo", 2): [0.1, 0.2, 0.3, 0.4, 0.45],  # never: censored at its last validated step, 20
}
STEP_SECONDS = {"tepo": 2.0, "grpo": 1.0, "dapo": 1.5}
RESPONSES_PER_STEP = {"tepo": 12, "grpo": 12, "dapo": 18}  # DAPO regenerates filtered groups
CHECKPOINT_SECONDS = 5.0  # a checkpoint at step 10, inside timing_s/step, not counted as training time


def write_run(path, label, seed):
    with open(path, "w") as f:
        for step in range(0, 21):
            data = {}
            if step:
                data = {"timing_s/step": STEP_SECONDS[label], "critic/score/mean": 0.02 * step,
                        "response_length/mean": 100.0 + step,
                        "tepo_verl/entropy_token_mean": 1.0 - 0.01 * step * seed,
                        "actor/entropy": 5.0,  # verl's, averaged per loss_agg_mode: never read
                        "tepo_verl/responses_generated": RESPONSES_PER_STEP[label]}
                if step == 10:
                    data["timing_s/step"] += CHECKPOINT_SECONDS
                    data["timing_s/save_checkpoint"] = CHECKPOINT_SECONDS
                if label != "dapo":  # a run that logs no clip fraction shows nan
                    data["actor/pg_clipfrac"] = 0.1 * seed
                if label == "tepo":
                    data["actor/tepo/mask_frac"] = 0.1 * seed
                    data["actor/tepo/masked_kl_mean"] = 0.01 * seed
                    data["actor/tepo/mask_frac_positive"] = 0.9 - 0.001 * step  # mean over steps 1-20: 0.8895
                    data["actor/tepo/penalty_grad_ratio"] = 0.02 * seed + (0.01 if step > 10 else 0.0)
            if step % 5 == 0:
                acc = VAL[(label, seed)][step // 5]
                data["val-core/gsm/acc/mean@4"] = acc
                data["val-core/aime/acc/mean@4"] = acc  # two data sources, averaged
                data["val-aux/gsm/reward/mean@4"] = 99.0  # ignored: not core
            f.write(json.dumps({"step": step, "data": data}) + "\n")
            if step == 10:  # a second record for the same step is merged
                f.write(json.dumps({"step": step, "data": {"extra": 1}}) + "\n")


@pytest.fixture
def runs_dir(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    for label, seed in VAL:
        write_run(folder / f"{label}-seed{seed}.jsonl", label, seed)
    return folder


@pytest.fixture
def tables(runs_dir):
    per_run = per_run_table(load_runs([str(runs_dir)]), target=0.5)
    return per_run, summarize(per_run, n_resamples=2000).set_index("algorithm"), \
        paired_differences(per_run, "tepo", n_resamples=2000)


def test_labels_seeds_and_steps_to_target(tmp_path):
    assert default_label(Path("tepo-seed12.jsonl")) == "tepo"
    assert default_label(Path("dapo_s3.jsonl")) == "dapo"
    assert default_label(Path("runs/cpu/grpo-seed2/metrics.jsonl")) == "grpo"
    assert default_label(Path("tepo-seed12.jsonl.gz")) == "tepo"  # compressed: the same run's name
    assert default_label(Path("results/tepo-kl0.1-seed3/metrics.jsonl.gz")) == "tepo-kl0.1"
    write_run(tmp_path / "x.jsonl", "tepo", 1)
    (tmp_path / "grpo-qwen-seed7").mkdir()
    write_run(tmp_path / "grpo-qwen-seed7" / "metrics.jsonl", "grpo", 1)
    seeds = {run.label: run.seed for run in load_runs([str(tmp_path / "x.jsonl"), str(tmp_path / "grpo-qwen-seed7")])}
    assert seeds == {"x": None, "grpo-qwen": 7}
    assert default_reference(["grpo", "tepo-qwen2.5-math-1.5b", "tepo_nomask-qwen2.5-math-1.5b"]) == \
        "tepo-qwen2.5-math-1.5b"
    assert default_reference(["grpo", "dapo"]) is None
    assert steps_to_target([(0, 0.1), (5, 0.5), (10, 0.4)], 0.5) == 5
    assert steps_to_target([(0, 0.1)], 0.5) is None


def test_auc_is_the_trapezoid_area_over_the_step_span():
    assert val_auc([(0, 0.1), (5, 0.3), (10, 0.5), (15, 0.6), (20, 0.6)]) == pytest.approx(8.75 / 20)
    assert val_auc([(10, 0.2), (20, 0.4)]) == pytest.approx(0.3)  # span 10, not 20
    assert val_auc([(4, 0.3)]) == 0.3 and val_auc([]) is None


def test_per_run_values_and_censoring(tables):
    per_run, _, _ = tables
    rows = per_run.set_index(["algorithm", "seed"])
    tepo1 = rows.loc[("tepo", 1)]
    assert tepo1.steps == 20 and tepo1.reached and not tepo1.censored
    assert tepo1.steps_to_target == 10 and tepo1.rollouts_to_target == 120  # 12 responses x steps 1..10
    assert tepo1.wall_s_to_target == 20.0  # 10 steps x 2 s; the checkpoint's 5 s left out
    assert tepo1.best_val_acc == 0.6 and tepo1.final_val_acc == 0.6 and tepo1.val_auc == pytest.approx(0.4375)
    assert tepo1.entropy_start == pytest.approx(0.99) and tepo1.entropy_end == pytest.approx(0.8)
    assert tepo1.kl_mask_fraction == pytest.approx(0.1) and tepo1.masked_kl == pytest.approx(0.01)
    assert tepo1.mask_share_positive == pytest.approx(0.8895) and tepo1.penalty_strength == pytest.approx(0.025)
    assert math.isnan(rows.loc[("grpo", 1)].mask_share_positive) and math.isnan(rows.loc[("grpo", 1)].penalty_strength)
    assert tepo1.response_length == pytest.approx(110.5)
    assert tepo1.clip_fraction == pytest.approx(0.1) and math.isnan(rows.loc[("dapo", 1)].clip_fraction)
    dapo2 = rows.loc[("dapo", 2)]  # never reaches 0.5: kept, censored at its last validated step
    assert not dapo2.reached and dapo2.censored
    assert dapo2.steps_to_target == 20 and dapo2.rollouts_to_target == 360 and dapo2.wall_s_to_target == 30.0
    assert list(per_run.algorithm) == ["dapo"] * 2 + ["grpo"] * 3 + ["tepo"] * 3


def test_summary_means_and_intervals(tables):
    _, summary, _ = tables
    tepo, grpo, dapo = summary.loc["tepo"], summary.loc["grpo"], summary.loc["dapo"]
    assert (tepo.seeds, tepo.reached, tepo.censored, tepo.steps) == (3, 3, 0, 20)
    assert tepo.steps_to_target == pytest.approx(25 / 3) and grpo.steps_to_target == 15
    assert tepo.rollouts_to_target == 100 and grpo.rollouts_to_target == 180
    assert tepo.wall_s_to_target == pytest.approx(50 / 3) and grpo.wall_s_to_target == 15
    assert (dapo.seeds, dapo.reached, dapo.censored) == (2, 1, 1)
    assert dapo.steps_to_target == 15 and dapo.rollouts_to_target == 270 and dapo.wall_s_to_target == 22.5
    assert tepo.val_auc == pytest.approx((0.4375 + 0.4125 + 0.4875) / 3)
    assert tepo.best_val_acc == pytest.approx(0.6333333) and tepo.final_val_acc == pytest.approx(0.6333333)
    assert tepo.entropy_start == pytest.approx(0.98) and tepo.entropy_end == pytest.approx(0.6)
    assert math.isnan(grpo.kl_mask_fraction) and tepo.kl_mask_fraction == pytest.approx(0.2)
    assert tepo.clip_fraction == pytest.approx(0.2) and math.isnan(summary.loc["dapo"].clip_fraction)
    # the final entropy gets an interval too (seeds end at 0.8, 0.6, 0.4); the start entropy is a plain mean
    assert 0.4 - 1e-12 <= tepo.entropy_end_ci_low < 0.6 < tepo.entropy_end_ci_high <= 0.8 + 1e-12
    assert "entropy_start_ci_low" not in summary.columns
    # tepo's steps to target are 10, 10, 5: every resampled mean lies in [5, 10]
    assert 5 <= tepo.steps_to_target_ci_low < tepo.steps_to_target < tepo.steps_to_target_ci_high <= 10
    # dapo's two seeds (10 and 20 censored): resampled means 10, 15 or 20, with probabilities 1/4, 1/2, 1/4
    assert (dapo.steps_to_target_ci_low, dapo.steps_to_target_ci_high) == (10, 20)


def test_paired_differences_by_seed(tables):
    _, _, paired = tables
    rows = paired.set_index(["baseline", "metric"])
    steps = rows.loc[("grpo", "steps_to_target")]
    assert steps.pairs == 3 and steps.censored_pairs == 0 and steps.seeds == "1 2 3"
    assert steps.mean_difference == pytest.approx((-5 - 10 - 5) / 3)  # 10-15, 10-20, 5-10
    assert -10 <= steps.ci_low < steps.mean_difference < steps.ci_high <= -5
    assert rows.loc[("grpo", "rollouts_to_target")].mean_difference == pytest.approx(-80)
    assert rows.loc[("grpo", "val_auc")].mean_difference == pytest.approx((0.1125 + 0.075 + 0.0875) / 3)
    dapo = rows.loc[("dapo", "steps_to_target")]  # dapo has no seed 3; its seed 2 is censored
    assert dapo.pairs == 2 and dapo.seeds == "1 2" and dapo.censored_pairs == 1
    assert dapo.mean_difference == -5 and (dapo.ci_low, dapo.ci_high) == (-10, 0)
    assert rows.loc[("dapo", "final_val_acc")].censored_pairs == 0
    entropy = rows.loc[("grpo", "entropy_end")]  # every seed's entropy ends where that seed's grpo run's does
    assert entropy.pairs == 3 and entropy.mean_difference == pytest.approx(0) and entropy.p_value == 1.0
    assert steps.p_value == pytest.approx(2 / 8)  # three negative differences: 2 of the 8 sign patterns as extreme
    assert dapo.p_value == pytest.approx(1.0)  # -10 and 0: every pattern's |mean| is 5
    assert set(paired.baseline) == {"grpo", "dapo"}


def test_step_ratios_use_the_seeds_both_ran(tables):
    per_run, _, _ = tables
    ratios = step_ratios(per_run, "tepo")
    assert set(ratios) == {"grpo", "dapo"}
    grpo_ratio, grpo_seeds = ratios["grpo"]
    assert grpo_ratio == pytest.approx((25 / 3) / 15) and grpo_seeds == "seeds 1 2 3"  # (10+10+5)/3 / (15+20+10)/3
    dapo_ratio, dapo_seeds = ratios["dapo"]  # dapo has no seed 3, so tepo's seed 3 (5 steps) is left out
    assert dapo_ratio == pytest.approx(10 / 15) and dapo_seeds == "seeds 1 2"
    unseeded = per_run.assign(seed=[math.nan if label == "dapo" else seed
                                    for label, seed in zip(per_run["algorithm"], per_run["seed"], strict=True)])
    ratio, over = step_ratios(unseeded, "tepo")["dapo"]
    assert ratio == pytest.approx((25 / 3) / 15) and over == "all runs, no shared seeds"
    assert step_ratios(per_run, "gspo") == {} and step_ratios(per_run, None) == {}


def test_bootstrap_interval_properties():
    rng = np.random.default_rng(1)
    values = rng.normal(10, 2, size=5)
    low, high = bootstrap_ci(values)
    assert low < values.mean() < high
    assert bootstrap_ci(values) == (low, high)  # fixed seed: reproducible
    assert bootstrap_ci(values, seed=1) != (low, high)
    low4, high4 = bootstrap_ci(np.tile(values, 4))  # same spread, four times the seeds
    assert high4 - low4 < 0.7 * (high - low)
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)  # resampled means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    assert bootstrap_ci([3.0, 3.0, 3.0]) == (3.0, 3.0)
    assert all(math.isnan(v) for v in bootstrap_ci([3.0])) and all(math.isnan(v) for v in bootstrap_ci([None, 1]))


def test_bootstrap_interval_is_the_95_percent_percentile_interval():
    """The level is pinned: with five values every one of the 5**5 resamples can be enumerated, so the exact
    percentile-bootstrap interval is known; the default call matches it (and scipy's percentile bootstrap) within
    the Monte Carlo error, and the 80% and 99% intervals are far from it."""
    from itertools import product

    from scipy import stats

    values = np.array([0.0, 1.0, 3.0, 7.0, 15.0])
    exact_means = np.array([values[list(pick)].mean() for pick in product(range(5), repeat=5)])  # all 3125

    def exact(level):
        return tuple(np.quantile(exact_means, [(1 - level) / 2, 1 - (1 - level) / 2]))

    tolerance = 0.15  # Monte Carlo error of 200k resamples on means that range over 0..15
    assert CONFIDENCE == 0.95
    ours = bootstrap_ci(values, n_resamples=200_000)
    np.testing.assert_allclose(ours, exact(0.95), atol=tolerance)
    theirs = stats.bootstrap((values,), np.mean, confidence_level=0.95, method="percentile", n_resamples=200_000,
                             random_state=0).confidence_interval
    np.testing.assert_allclose(ours, (theirs.low, theirs.high), atol=tolerance)
    # the level matters here: an end of the 80% and of the 99% interval lies well outside the tolerance
    for other in (0.8, 0.99):
        assert np.abs(np.subtract(exact(other), exact(0.95))).max() > 4 * tolerance, other
        np.testing.assert_allclose(bootstrap_ci(values, confidence=other, n_resamples=200_000), exact(other),
                                   atol=tolerance)


def slow_sign_flip_p(differences) -> float:
    """The sign-flip test from its definition: the share of the 2**n sign patterns whose |mean| reaches the
    observed |mean| (ties by a relative tolerance, as exact arithmetic would count them)."""
    data = np.asarray(differences, dtype=float)
    observed = abs(data.mean())
    means = [abs((data * np.array(signs)).mean()) for signs in itertools.product((1.0, -1.0), repeat=len(data))]
    return sum(m >= observed * (1 - 1e-12) for m in means) / len(means)


def test_sign_flip_p_goldens():
    assert sign_flip_p([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)  # only all-plus and all-minus are as extreme
    assert sign_flip_p([5, -1, 2, 3, 4]) == pytest.approx(4 / 32)  # also the pattern that flips only the -1
    assert sign_flip_p([1, -1]) == 1.0 and sign_flip_p([0.0, 0.0, 0.0]) == 1.0
    assert math.isnan(sign_flip_p([3.0])) and math.isnan(sign_flip_p([None, 2.0]))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False).map(lambda v: round(v, 2)), min_size=2, max_size=8))
@example([0.0, 0.0, 1.5, 1.5, 1.62, 1.62, 10.25, -16.5])  # a mean of -0.00125: ties far below the data's scale
def test_sign_flip_p_matches_its_definition(differences):
    p = sign_flip_p(differences)
    assert 2.0 ** (1 - len(differences)) - 1e-12 <= p <= 1.0
    if any(differences):
        assert p == pytest.approx(slow_sign_flip_p(differences), abs=1e-9)
    assert sign_flip_p([-d for d in differences]) == pytest.approx(p)  # symmetric in the sign


def test_the_p_value_floor_is_said_as_the_test_can_show_it():
    assert p_value_floor(5) == "with 5 pairs the smallest possible p is 0.0625"
    assert p_value_floor(10) == "with 10 pairs the smallest possible p is 0.001953"
    assert p_value_floor(1) == "with 1 pair there is no test: p is nan"  # as sign_flip_p gives
    assert math.isnan(sign_flip_p([0.3])) and sign_flip_p([0.3, 0.1]) == pytest.approx(2.0 ** (1 - 2))


def test_sign_flip_p_samples_beyond_the_exact_limit():
    differences = np.random.default_rng(0).normal(1.0, 1.0, size=24)  # 2**24 patterns: sampled, seeded
    p = sign_flip_p(differences, n_resamples=4000)
    assert p == sign_flip_p(differences, n_resamples=4000) and 0 < p < 0.01


def test_auto_target_is_reachable_by_every_algorithm(runs_dir):
    # best seed-mean accuracy: tepo 0.6333 (step 20), grpo 0.5, dapo (0.6 + 0.45) / 2 = 0.525 -> 0.9 * 0.5
    assert auto_target(load_runs([str(runs_dir)])) == pytest.approx(0.45)


def test_command_writes_tables_csv_and_plots(runs_dir, tmp_path, capsys):
    out = tmp_path / "report"
    assert main([f"tepo={runs_dir / 'tepo-seed1.jsonl'}", f"tepo={runs_dir / 'tepo-seed2.jsonl'}",
                 str(runs_dir / "grpo-seed1.jsonl"), str(runs_dir / "grpo-seed2.jsonl"),
                 str(runs_dir / "dapo-seed2.jsonl"),
                 "--target", "0.5", "--out", str(out), "--resamples", "1000"]) == 0
    printed = capsys.readouterr().out
    assert "steps-to-target tepo / grpo = 0.571 (42.9% fewer steps for tepo; seeds 1 2)" in printed
    assert re.search(r"\| tepo +\| +2 \| +20 \| +2/2 \| +10 \[10, 10\] \|", printed)
    assert re.search(r"\| dapo +\| +1 \| +20 \| +0/1 \| +>= 20 \|", printed)  # one censored seed: a lower bound
    csv = pd.read_csv(out / "compare.csv")
    assert list(csv.algorithm) == ["dapo", "grpo", "tepo"] and list(csv.steps_to_target) == [20.0, 17.5, 10.0]
    assert len(pd.read_csv(out / "compare_runs.csv")) == 5
    paired = pd.read_csv(out / "compare_paired.csv").set_index(["baseline", "metric"])
    assert paired.loc[("grpo", "steps_to_target"), "mean_difference"] == -7.5
    written = (out / "compare.md").read_text()
    assert written.startswith("Target validation accuracy: 0.5000")
    # grpo pairs seeds 1 and 2, dapo seed 2 only: the sentence gives the floor of each pair count
    assert ("(with 1 pair there is no test: p is nan, with 2 pairs the smallest possible p is 0.5; with few seeds"
            in written)
    for name in ("val_accuracy", "reward", "entropy", "clip_fraction", "kl_mask_fraction", "masked_kl",
                 "mask_share_positive", "penalty_strength"):
        assert (out / f"{name}.png").stat().st_size > 1000


def test_runs_without_the_common_entropy_are_named(tmp_path, capsys):
    path = tmp_path / "grpo-seed1.jsonl"
    path.write_text(json.dumps({"step": 0, "data": {"val-core/a/acc/mean@1": 0.2}}) + "\n"
                    + json.dumps({"step": 1, "data": {"actor/entropy": 0.7, "val-core/a/acc/mean@1": 0.3}}) + "\n")
    assert main([str(path), "--out", str(tmp_path / "o"), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert "no tepo_verl/entropy_token_mean in 1 run(s)" in printed and str(path) in printed
    assert math.isnan(pd.read_csv(tmp_path / "o" / "compare.csv").entropy_start[0])


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(RunError, match="missing.jsonl does not exist"):
        load_runs([str(tmp_path / "missing.jsonl")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 0, "data": {}}\n{"nostep": 1}\n')
    with pytest.raises(RunError, match="bad.jsonl:2: not a verl file-logger record"):
        load_runs([str(bad)])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RunError, match="no verl file-logger \\*.jsonl or \\*.jsonl.gz file"):
        load_runs([str(empty)])
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_run(tmp_path / name / "tepo-seed1.jsonl", "tepo", 1)
    with pytest.raises(RunError, match="two runs of tepo with seed 1"):
        load_runs([str(tmp_path / "a"), str(tmp_path / "b")])


def _compare(capsys, *args) -> tuple[int, str]:
    """`tepo-verl compare ARGS` as its console script runs it (tepo_verl.cli.main): its exit code and its stderr."""
    try:
        code = cli.main(["compare", *map(str, args)])
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err


def _one_line_error(result, text):
    code, stderr = result
    assert code == 2, result
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tepo-verl compare: error: ") and text in lines[0], lines


def test_command_fails_cleanly_on_a_folder_without_runs(tmp_path, capsys):
    (tmp_path / "val_generations").mkdir()
    (tmp_path / "val_generations" / "0.jsonl").write_text('{"input": "q", "output": "a"}\n')
    _one_line_error(_compare(capsys, tmp_path, "--out", tmp_path / "o"),
                    f"no verl file-logger *.jsonl or *.jsonl.gz file under {tmp_path}")


def test_command_fails_cleanly_on_a_missing_path(tmp_path, capsys):
    _one_line_error(_compare(capsys, tmp_path / "nowhere", "--out", tmp_path / "o"), "nowhere does not exist")


def test_command_fails_cleanly_on_a_malformed_line(tmp_path, capsys):
    run = tmp_path / "tepo-seed1.jsonl"
    run.write_text('{"step": 0, "data": {"val-core/a/acc/mean@1": 0.2}}\n{"step": 1, "data": {"x": 1\n')
    _one_line_error(_compare(capsys, run, "--out", tmp_path / "o"), f"{run}:2: not a verl file-logger record")


def _compressed_copy(runs_dir: Path, out: Path) -> Path:
    """Every run of `runs_dir` as NAME.jsonl.gz in `out`."""
    out.mkdir()
    for path in runs_dir.glob("*.jsonl"):
        (out / f"{path.name}.gz").write_bytes(gzip.compress(path.read_bytes()))
    return out


def test_compressed_runs_compare_as_their_plain_copies(runs_dir, tmp_path):
    compressed = _compressed_copy(runs_dir, tmp_path / "gz")
    plain_runs, packed_runs = load_runs([str(runs_dir)]), load_runs([str(compressed)])
    assert [(r.label, r.seed, r.metrics) for r in plain_runs] == [(r.label, r.seed, r.metrics) for r in packed_runs]
    assert [r.path for r in packed_runs] == [compressed / f"{r.path.name}.gz" for r in plain_runs]
    one = compressed / "tepo-seed1.jsonl.gz"  # a file given by name, and a run folder's metrics.jsonl.gz
    (tmp_path / "grpo-seed7").mkdir()
    (tmp_path / "grpo-seed7" / "metrics.jsonl.gz").write_bytes((compressed / "grpo-seed1.jsonl.gz").read_bytes())
    assert [(r.label, r.seed) for r in load_runs([str(one), str(tmp_path / "grpo-seed7")])] == [("tepo", 1),
                                                                                                ("grpo", 7)]
    for folder in (runs_dir, compressed):
        assert main([str(folder), "--target", "0.5", "--out", str(tmp_path / f"out-{folder.name}"),
                     "--resamples", "500", "--no-plots"]) == 0
    out_plain, out_packed = tmp_path / f"out-{runs_dir.name}", tmp_path / f"out-{compressed.name}"
    for name in ("compare.md", "compare.csv", "compare_paired.csv"):
        assert (out_plain / name).read_text() == (out_packed / name).read_text(), name
    per_run_plain, per_run_packed = pd.read_csv(out_plain / "compare_runs.csv"), pd.read_csv(out_packed /
                                                                                             "compare_runs.csv")
    assert list(per_run_packed.run) == [f"{compressed / Path(run).name}.gz" for run in per_run_plain.run]
    pd.testing.assert_frame_equal(per_run_plain.drop(columns="run"), per_run_packed.drop(columns="run"))


def test_a_bad_compressed_run_is_named(tmp_path):
    not_gzip = tmp_path / "tepo-seed1.jsonl.gz"
    not_gzip.write_text('{"step": 0, "data": {}}\n')  # plain text under the compressed name
    with pytest.raises(RunError, match=f"cannot read run file {re.escape(str(not_gzip))}: Not a gzipped file"):
        load_runs([str(not_gzip)])
    cut = tmp_path / "tepo-seed2.jsonl.gz"
    write_run(tmp_path / "whole.jsonl", "tepo", 2)
    packed = gzip.compress((tmp_path / "whole.jsonl").read_bytes())
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(RunError, match=f"cannot read run file {re.escape(str(cut))}: Compressed file ended"):
        load_runs([str(cut)])
    both = tmp_path / "grpo-seed1"
    both.mkdir()
    write_run(both / "metrics.jsonl", "grpo", 1)
    (both / "metrics.jsonl.gz").write_bytes(gzip.compress((both / "metrics.jsonl").read_bytes()))
    with pytest.raises(RunError, match="holds both metrics.jsonl and metrics.jsonl.gz: keep one"):
        metrics_file(both)
    with pytest.raises(RunError, match="two runs of grpo with seed 1"):  # a folder given whole: both are found
        load_runs([str(both)])


def test_folders_pass_over_validation_dumps(runs_dir):
    dump = runs_dir / "tepo-seed1-extra" / "val_generations"
    dump.mkdir(parents=True)
    (dump / "0.jsonl").write_text('{"input": "q", "output": "a", "gts": "a", "score": 1.0, "step": 0}\n')
    assert sorted({run.label for run in load_runs([str(runs_dir)])}) == ["dapo", "grpo", "tepo"]


# ------------------------------------------------------------------ docs/presets.md: how the presets differ

def _leaves(node, prefix=""):
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def _text(value) -> str:
    """A composed value as YAML spells it (true, false, null), else its str()."""
    return "true" if value is True else "false" if value is False else "null" if value is None else str(value)


def documented_preset_differences() -> tuple[list[str], dict[str, list[str]]]:
    """The table of docs/presets.md's "How the presets differ" section: preset names, and key -> cell texts."""
    section = PRESETS_DOC.read_text(encoding="utf-8").split("## How the presets differ", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    header = [cell.strip().strip("`") for cell in rows[0].strip("|").split("|")]
    table = {}
    for line in rows[1:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if set(cells[0]) <= {"-", " "}:
            continue
        table[cells[0].strip("`")] = [cell.strip("`") if cell != "—" else "—" for cell in cells[1:]]
    return header[1:], table


@pytest.mark.verl_090
def test_the_docs_list_exactly_the_keys_in_which_the_presets_differ():
    from verl_config import compose_config

    from tepo_verl.config import preset_names

    configs = {p: _leaves(OmegaConf.to_container(compose_config([f"+algorithm={p}"]), resolve=True))
               for p in PRESETS}
    keys = set().union(*configs.values())
    differing = {key: [_text(configs[p][key]) if key in configs[p] else "—" for p in PRESETS]
                 for key in sorted(keys) if len({repr(configs[p].get(key, KeyError)) for p in PRESETS}) > 1}
    presets, table = documented_preset_differences()
    assert presets == PRESETS and sorted(PRESETS) == preset_names()  # every shipped preset, in the table's order
    assert "actor_rollout_ref.actor.clip_ratio_c" in differing and "algorithm.filter_groups.enable" in differing
    assert table == differing
