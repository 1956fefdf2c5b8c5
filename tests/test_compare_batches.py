"""`tepo-verl compare` on algorithms whose training batch is filtered (DAPO's dynamic sampling): their batch metrics
are marked and never paired with an unfiltered algorithm's; and the penalty's strength read from the metric a run
logged."""

from __future__ import annotations

import json

import pytest

from tepo_verl.report.compare import BATCH_METRICS, main, paired_differences, per_run_table
from tepo_verl.report.runs import load_runs

STEPS = 8


def write_run(path, *, entropy: float, filtered: bool, seed: int, **extra) -> None:
    """A run whose entropy is `entropy` at every step, validated every 4 steps; `filtered` adds the metrics verl's
    dynamic sampling logs."""
    with path.open("w") as f:
        for step in range(STEPS + 1):
            data = {"val-core/chain/acc/mean@1": 0.2 + 0.01 * step * seed} if step % 4 == 0 else {}
            if step:
                data |= {"tepo_verl/entropy_token_mean": entropy + 0.001 * seed, "response_length/mean": 30.0,
                         "critic/score/mean": 0.3, **extra}
                if filtered:
                    data |= {"training/filter_groups/evicted_samples": 8.0,
                             "training/filter_groups/discarded_surplus_samples": 0.0}
            f.write(json.dumps({"step": step, "data": data}) + "\n")


@pytest.fixture
def runs(tmp_path):
    for seed in (1, 2, 3):
        write_run(tmp_path / f"tepo-seed{seed}.jsonl", entropy=0.17, filtered=False, seed=seed)
        write_run(tmp_path / f"grpo-seed{seed}.jsonl", entropy=0.16, filtered=False, seed=seed)
        write_run(tmp_path / f"dapo-seed{seed}.jsonl", entropy=0.14, filtered=True, seed=seed)
    return tmp_path


def test_a_filtered_batchs_metrics_are_not_paired_with_an_unfiltered_ones(runs):
    per_run = per_run_table(load_runs([str(runs)]), target=0.25)
    assert dict(zip(per_run["algorithm"], per_run["filtered_batch"])) == {"tepo": False, "grpo": False, "dapo": True}
    paired = paired_differences(per_run, "tepo", n_resamples=200).set_index(["baseline", "metric"])
    batch_metrics = [name for name in BATCH_METRICS if name in paired.index.get_level_values("metric")]
    assert batch_metrics == ["entropy_end"]  # the one batch metric with a paired difference
    assert ("grpo", "entropy_end") in paired.index and ("dapo", "entropy_end") not in paired.index
    assert paired.loc[("grpo", "entropy_end")].mean_difference == pytest.approx(0.01)
    assert ("dapo", "val_auc") in paired.index  # validation runs on every problem: paired as ever


def test_compare_says_which_algorithms_trained_on_a_filtered_batch(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(runs), "--target", "0.25", "--out", str(out), "--resamples", "200", "--no-plots"]) == 0
    text = (out / "compare.md").read_text()
    assert "Trained on a filtered batch (dynamic sampling keeps the groups whose rewards differ): dapo. " in text
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| ")]
    pairs = {(a.strip(), m.strip()) for a, m in rows}
    assert ("grpo", "entropy_end") in pairs and ("dapo", "entropy_end") not in pairs


def test_the_penalty_strength_is_the_logged_share_and_the_older_ratio_only_without_it(tmp_path):
    write_run(tmp_path / "tepo-seed1.jsonl", entropy=0.17, filtered=False, seed=1,
              **{"actor/tepo/penalty_grad_share": 0.02, "actor/tepo/penalty_grad_ratio": 0.5})
    write_run(tmp_path / "tepo-seed2.jsonl", entropy=0.17, filtered=False, seed=2,
              **{"actor/tepo/penalty_grad_ratio": 0.01})
    per_run = per_run_table(load_runs([str(tmp_path)]), target=0.25).set_index("seed")
    assert per_run.loc[1, "penalty_strength"] == pytest.approx(0.02)
    assert per_run.loc[2, "penalty_strength"] == pytest.approx(0.01)


def test_the_docs_quote_dapos_filtered_start_from_the_committed_runs():
    """docs/compare.md's example: DAPO's entropy at step 1, before any update, against the other main arms'."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    runs = load_runs([str(path) for path in sorted((repo / "benchmarks" / "results" / "cpu-chain").glob("*-seed*"))
                      if path.name.rsplit("-seed", 1)[0] in ("tepo", "tepo_nomask", "gspo", "grpo", "dapo")])
    start = {}
    for run in runs:
        start.setdefault(run.label, []).append(dict(run.series("tepo_verl/entropy_token_mean"))[1])
    means = {label: sum(values) / len(values) for label, values in start.items()}
    others = sorted(means[label] for label in means if label != "dapo")
    assert len(others) == 4 and all(len(values) == 10 for values in start.values())
    text = " ".join((repo / "docs" / "compare.md").read_text().split())
    assert (f"DAPO's entropy at step 1, before any update, was {means['dapo']:.3f} against "
            f"{others[0]:.3f}-{others[-1]:.3f} for the others") in text
    assert all(run.filtered_batch == (run.label == "dapo") for run in runs)
