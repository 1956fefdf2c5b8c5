"""The comparison report on synthetic verl file-logger runs with known curves."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from tepo_verl.report.compare import auto_target, default_reference, main, steps_to_target, summarize
from tepo_verl.report.runs import default_label, load_runs

VAL = {  # label, seed -> validation accuracy at steps 0, 5, 10, 15, 20
    ("tepo", 1): [0.1, 0.3, 0.5, 0.6, 0.6],
    ("tepo", 2): [0.1, 0.2, 0.5, 0.55, 0.7],
    ("grpo", 1): [0.1, 0.2, 0.3, 0.5, 0.5],
    ("grpo", 2): [0.1, 0.2, 0.4, 0.45, 0.5],
    ("dapo", 1): [0.1, 0.2, 0.3, 0.4, 0.45],
}
STEP_SECONDS = {"tepo": 2.0, "grpo": 1.0, "dapo": 1.5}


def write_run(path, label, seed):
    with open(path, "w") as f:
        for step in range(0, 21):
            data = {}
            if step:
                data = {"timing_s/step": STEP_SECONDS[label], "actor/entropy": 1.0 - 0.01 * step * seed,
                        "critic/score/mean": 0.02 * step, "response_length/mean": 100.0 + step}
                if label == "tepo":
                    data["actor/tepo/mask_frac"] = 0.1 * seed
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
    for label, seed in VAL:
        write_run(tmp_path / f"{label}-seed{seed}.jsonl", label, seed)
    return tmp_path


def test_labels_and_steps_to_target():
    assert default_label(__import__("pathlib").Path("tepo-seed12.jsonl")) == "tepo"
    assert default_label(__import__("pathlib").Path("dapo_s3.jsonl")) == "dapo"
    assert default_label(__import__("pathlib").Path("runs/cpu/grpo-seed2/metrics.jsonl")) == "grpo"
    assert default_reference(["grpo", "tepo-qwen2.5-math-1.5b", "tepo_nomask-qwen2.5-math-1.5b"]) == \
        "tepo-qwen2.5-math-1.5b"
    assert default_reference(["grpo", "dapo"]) is None
    assert steps_to_target([(0, 0.1), (5, 0.5), (10, 0.4)], 0.5) == 5
    assert steps_to_target([(0, 0.1)], 0.5) is None


def test_summary_table_is_exact(runs_dir):
    runs = load_runs([str(runs_dir)])
    table = summarize(runs, target=0.5).set_index("algorithm")
    assert list(table.index) == ["dapo", "grpo", "tepo"]
    tepo, grpo, dapo = table.loc["tepo"], table.loc["grpo"], table.loc["dapo"]
    assert tepo.seeds == 2 and tepo.steps == 20
    assert tepo.steps_to_target == 10 and tepo.steps_to_target_std == 0 and tepo.reached_target == "2/2"
    assert grpo.steps_to_target == 17.5 and grpo.steps_to_target_std == pytest.approx(math.sqrt(12.5))
    assert dapo.reached_target == "0/1" and math.isnan(dapo.steps_to_target)
    assert tepo.wall_s_to_target == 20.0 and grpo.wall_s_to_target == 17.5
    assert tepo.final_val_acc == pytest.approx(0.65) and tepo.best_val_acc == pytest.approx(0.65)
    assert grpo.final_val_acc == pytest.approx(0.5) and dapo.best_val_acc == pytest.approx(0.45)
    assert tepo.entropy_start == pytest.approx(1 - 0.01 * 1.5) and tepo.entropy_end == pytest.approx(1 - 0.2 * 1.5)
    assert tepo.response_length == pytest.approx(110.5)
    assert tepo.kl_mask_fraction == pytest.approx(0.15) and math.isnan(grpo.kl_mask_fraction)


def test_auto_target_is_reachable_by_every_algorithm(runs_dir):
    runs = load_runs([str(runs_dir)])
    # best seed-mean accuracy: tepo 0.65, grpo 0.5, dapo 0.45 -> 0.9 * 0.45
    assert auto_target(runs) == pytest.approx(0.405)


def test_command_writes_table_csv_and_plots(runs_dir, tmp_path, capsys):
    out = tmp_path / "report"
    assert main([f"tepo={runs_dir / 'tepo-seed1.jsonl'}", f"tepo={runs_dir / 'tepo-seed2.jsonl'}",
                 str(runs_dir / "grpo-seed1.jsonl"), str(runs_dir / "grpo-seed2.jsonl"),
                 "--target", "0.5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "steps-to-target tepo / grpo = 0.571 (42.9% fewer steps for tepo)" in printed
    csv = pd.read_csv(out / "compare.csv")
    assert list(csv.algorithm) == ["grpo", "tepo"] and list(csv.steps_to_target) == [17.5, 10.0]
    assert (out / "compare.md").read_text().startswith("Target validation accuracy: 0.5000")
    for name in ("val_accuracy", "reward", "entropy", "kl_mask_fraction"):
        assert (out / f"{name}.png").stat().st_size > 1000


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist"):
        load_runs([str(tmp_path / "missing.jsonl")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nostep": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not a verl file-logger record"):
        load_runs([str(bad)])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no verl file-logger \\*.jsonl file"):
        load_runs([str(empty)])


def test_folders_pass_over_validation_dumps(runs_dir):
    dump = runs_dir / "tepo-seed1-extra" / "val_generations"
    dump.mkdir(parents=True)
    (dump / "0.jsonl").write_text('{"input": "q", "output": "a", "gts": "a", "score": 1.0, "step": 0}\n')
    assert sorted({run.label for run in load_runs([str(runs_dir)])}) == ["dapo", "grpo", "tepo"]
