"""`tepo-lab demo` (the main job of `make demo`): its console lines, its handling of verl's JSONL as it grows,
its failures, and the whole driver around a stand-in for recipes/cpu.sh (the real recipe runs in the e2e tests
and in `make demo`)."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest

from tepo_lab import demo

#: `make demo` prints at most 60 lines in all on a fresh clone; the set-up's share is one line per stage
#: (tests/test_quiet_setup.py), four.
DEMO_LINE_BUDGET = 60 - 4

FAKE_RECIPE = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    # Stands in for recipes/cpu.sh: writes verl-like file-logger records one by one, and its log.
    set -euo pipefail
    echo "verl would print hundreds of lines here" > "$RUN_DIR/console.log"
    if [[ "${FAKE_FAIL:-}" == "$ALGO" ]]; then  # as the recipe fails in quiet mode: the log's end and its path
      echo "Traceback: boom in $ALGO" >> "$RUN_DIR/console.log"
      { echo "[cpu.sh] verl failed (exit 3); the end of its log:"; tail -n 25 "$RUN_DIR/console.log" | sed 's/^/    /'
        echo "[cpu.sh] the whole log: $RUN_DIR/console.log"; } >&2
      exit 3
    fi
    acc=0.25
    for step in $(seq 0 "$STEPS"); do
      data="{\\"training/global_step\\": $step"
      (( step > 0 )) && data="$data, \\"critic/score/mean\\": 0.5"
      if (( step == 0 || step % TEST_FREQ == 0 || step == STEPS )); then
        data="$data, \\"val-core/tepo_tiny_addition/acc/mean@1\\": $acc"
      fi
      [[ "$ALGO" == dapo && $step == 1 ]] && data="$data, \\"training/filter_groups/evicted_samples\\": 8"
      [[ "$ALGO" == tepo ]] && data="$data, \\"actor/tepo/mask_frac\\": 0.1"
      printf '%s' "{\\"step\\": $step, \\"data\\": $data}}" >> "$RUN_DIR/metrics.jsonl"   # a line being written
      sleep 0.05
      printf '\\n' >> "$RUN_DIR/metrics.jsonl"
      acc=0.3$step
    done
    """
)


@pytest.fixture
def fake_recipe(tmp_path, monkeypatch):
    script = tmp_path / "fake_cpu.sh"
    script.write_text(FAKE_RECIPE)
    monkeypatch.setattr(demo, "RECIPE", script)
    monkeypatch.setattr(demo, "check_stack", lambda: None)
    monkeypatch.setattr(demo, "prepare_tiny", lambda: ("[tiny] stand-in", 149_568))
    monkeypatch.setattr(demo, "POLL_S", 0.05)  # the stand-in logs a step every 0.05 s, not every few seconds
    monkeypatch.chdir(tmp_path)
    return script


def test_progress_line_shows_step_reward_validation_and_regeneration():
    record = {"step": 3, "data": {"critic/score/mean": 0.4375, "val-core/x/acc/mean@1": 0.28125,
                                  "training/filter_groups/evicted_samples": 12}}
    line = demo.progress_line("dapo", record, 6, started=0.0)
    assert line.startswith("[dapo] step 3/6  reward 0.438  val acc 0.281  regenerated 12 all-equal groups")
    before = demo.progress_line("tepo", {"step": 0, "data": {"val-core/x/acc/mean@1": 0.25}}, 6, started=0.0)
    assert "step 0/6" in before and "val acc 0.250 (before training)" in before and "reward" not in before


def test_records_wait_for_complete_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    assert demo._records(path, 0) == ([], 0)
    path.write_text('{"step": 0, "data": {}}\n{"step": 1, "da')
    records, seen = demo._records(path, 0)
    assert [r["step"] for r in records] == [0] and seen == 1
    path.write_text('{"step": 0, "data": {}}\n{"step": 1, "data": {}}\n')
    records, seen = demo._records(path, seen)
    assert [r["step"] for r in records] == [1] and seen == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algos", "tepo,ppo"], "unknown algorithm 'ppo' in --algos; valid: cispo, clip_cov, dapo, dr_grpo, gmpo, "
                                  "grpo, gspo, kl_cov, sapo, tepo, tepo_nomask"),
        (["--algos", ","], "--algos names no preset"),
        (["--algos", "tepo,tepo"], "--algos repeats a preset"),
    ],
)
def test_bad_algos_one_line(argv, message, capsys):
    assert demo.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"error: {message}\n" or (err.startswith(f"error: {message}") and err.count("\n") == 1), err


def test_bad_steps_is_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--steps", "0"])
    assert exit_info.value.code == 2
    assert "--steps: must be a positive integer, got '0'" in capsys.readouterr().err


def test_missing_cpu_stack_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(demo, "check_stack", lambda: "the CPU stack is not the tested one (verl: installed 0.9.0)")
    assert demo.main([]) == 1
    assert capsys.readouterr().err == "error: the CPU stack is not the tested one (verl: installed 0.9.0)\n"


def test_whole_driver_with_a_stand_in_recipe(fake_recipe, tmp_path, capsys):
    """Three runs of the default six steps, one line per logged step, the compact comparison table and the plot
    paths, then what the numbers mean, in few lines."""
    assert demo.main(["--runs-root", "runs"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for algo in ("tepo", "grpo", "dapo"):
        steps = [line for line in lines if line.startswith(f"[{algo}] step ")]
        assert [line.split()[2] for line in steps] == [f"{k}/6" for k in range(7)], steps
        assert "val acc 0.250 (before training)" in steps[0]
        assert "val acc 0.32" in steps[3] and "val acc" not in steps[1] and "val acc 0.35" in steps[6]
        assert f"[{algo}] done in" in out
        assert (tmp_path / "runs" / f"{algo}-seed1" / "console.log").exists()  # verl's output went to the run
    assert "regenerated 8 all-equal groups" in out
    assert "verl would print" not in out
    # the comparison: the compact per-algorithm table and the plot paths
    table_start = lines.index(next(line for line in lines if line.startswith("algorithm")))
    rows = {line.split()[0] for line in lines[table_start + 2: table_start + 5]}
    assert rows == {"tepo", "grpo", "dapo"}
    assert (tmp_path / "runs" / "compare" / "compare.csv").exists()
    plots = lines.index(next(line for line in lines if line.startswith("Plots: ")))
    assert "val_accuracy.png" in lines[plots]
    # then the context: six steps cannot rank; the committed study's headline and plot
    context = lines[plots + 2: plots + 5]
    assert context[0].startswith("These runs show verl's trainer running each algorithm; 6 steps of a "
                                 "150k-parameter model cannot rank algorithms"), context
    assert context[1].startswith("The committed study (") and context[2].startswith("Its validation curves: ")
    assert len(lines) <= DEMO_LINE_BUDGET, out


def _selected_study():
    return next(demo.STUDY_ROOT / name for name in demo.STUDIES if demo.study_runs(demo.STUDY_ROOT / name))


def test_the_study_headline_is_computed_from_the_committed_runs():
    """The headline's numbers are the committed study's main comparison (its compare.csv, written by the study
    runner from the same runs), recomputed here from the runs themselves, and the plot is the committed one."""
    study = _selected_study()
    headline, plot = demo.study_headline()
    assert f"({study.relative_to(demo.REPO)}: " in headline or f"({study}: " in headline
    with open(study / "compare" / "main" / "compare.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) >= 2
    for row in rows:
        interval = (f"[{float(row['val_auc_ci_low']):.3f}, {float(row['val_auc_ci_high']):.3f}]"
                    if row["val_auc_ci_low"] else f"(no interval: {row['seeds']} seed)")  # one seed: none
        cell = f"{row['algorithm']} {float(row['val_auc']):.3f} {interval}"
        assert cell in headline, (cell, headline)
    seeds = {int(row["seeds"]) for row in rows}
    assert f"{'-'.join(map(str, sorted(seeds)))} seeds per arm" in headline
    assert plot.endswith("compare/main/val_accuracy.png")
    assert (study / "compare" / "main" / "val_accuracy.png").is_file()


def test_the_headline_falls_back_to_the_next_study_until_the_first_has_runs(tmp_path):
    fallback = demo.STUDY_ROOT / demo.STUDIES[-1]
    assert demo.study_runs(fallback), f"the fallback study {fallback} has no finished runs"
    (tmp_path / "new" / "compare" / "main").mkdir(parents=True)
    (tmp_path / "new" / "compare" / "main" / "compare.csv").write_text("algorithm,seeds\ntepo,1\n")
    (tmp_path / "new" / "tepo-seed1").mkdir()
    (tmp_path / "new" / "tepo-seed1" / "run.json").write_text('{"arm": "tepo", "status": "running"}')
    (tmp_path / "old").symlink_to(fallback)
    headline = demo.study_headline(("new", "old"), root=tmp_path)
    assert len(headline) == 2 and f"({tmp_path / 'old'}: " in headline[0], headline
    # one arm finished (the chain study's GRPO seeds run first): still not a comparison, so still the fallback
    (tmp_path / "new" / "tepo-seed1" / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n')
    (tmp_path / "new" / "tepo-seed1" / "run.json").write_text('{"arm": "tepo", "status": "finished"}')
    assert demo.study_runs(tmp_path / "new") == []
    assert f"({tmp_path / 'old'}: " in demo.study_headline(("new", "old"), root=tmp_path)[0]
    assert demo.study_headline(("new", "missing"), root=tmp_path) == []  # no study with runs: no headline
    lines = demo.context_lines(6, None)
    assert lines[0].startswith("These runs show verl's trainer running each algorithm; 6 steps of a tiny model")


def test_a_failed_run_stops_with_its_log_tail(fake_recipe, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_FAIL", "grpo")
    assert demo.main(["--steps", "2", "--runs-root", "runs"]) == 1
    captured = capsys.readouterr()
    assert "[tepo] done in" in captured.out and "[dapo]" not in captured.out
    assert "error: grpo: recipes/cpu.sh failed (exit 3)" in captured.err
    # what the recipe said: the end of verl's log, to see why, and where the whole log is
    assert "    Traceback: boom in grpo" in captured.err
    assert f"[cpu.sh] the whole log: {(tmp_path / 'runs' / 'grpo-seed1' / 'console.log').resolve()}" in captured.err


def test_demo_reruns_start_clean(fake_recipe, tmp_path, capsys):
    run = tmp_path / "runs" / "tepo-seed1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 99, "data": {}}) + "\n")
    assert demo.main(["--algos", "tepo", "--steps", "1", "--runs-root", "runs"]) == 0
    assert "step 99" not in capsys.readouterr().out


def test_the_demo_outside_a_checkout_says_where_it_runs(monkeypatch, tmp_path, capsys):
    """The lab installed without this checkout has no recipes/cpu.sh to run: one line says where the demo runs."""
    assert demo.checkout_problem() is None  # the lab of this checkout
    monkeypatch.setattr(demo, "RECIPE", tmp_path / "site-packages" / "recipes" / "cpu.sh")
    assert demo.main(["--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the demo runs from a checkout of tepo-verl, where `make demo` runs it" in err, err
