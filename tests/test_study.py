"""benchmarks/study.py: the plan (arms, seeds, regime), and the runner's records, skipping and resuming, with a
stand-in recipe (no training)."""

from __future__ import annotations

import csv
import fcntl
import gzip
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from study_module import load_study

REPO = Path(__file__).resolve().parents[1]
study = load_study()

#: Stands in for recipes/cpu.sh: logs its environment and arguments, then writes a file-logger JSONL of STEPS steps
#: into $RUN_DIR (fewer with FAKE_SHORT=1 for the arm FAKE_ALGO; exit 1 with FAKE_FAIL=1 for that arm; a validation
#: accuracy rising 0.05 a step, 0.01 with FAKE_FLAT=1 for that arm).
FAKE = r"""#!/usr/bin/env bash
set -euo pipefail
printf '%s\n' "$(python -c 'import json, os, sys; print(json.dumps({"env": {k: os.environ.get(k) for k in ("TASK", "PRECISION", "N", "BATCH", "MINI", "STEPS", "TEST_FREQ", "ALGO", "SEED", "RUN_DIR", "QUIET", "COMPARE")}, "args": sys.argv[1:]}))' "$@")" >> "$FAKE_LOG"
last=$STEPS
if [[ "${FAKE_ALGO:-}" == "$ALGO" && "${FAKE_FAIL:-0}" == 1 ]]; then exit 1; fi
if [[ "${FAKE_ALGO:-}" == "$ALGO" && "${FAKE_SHORT:-0}" == 1 ]]; then last=$((STEPS - 1)); fi
for ((step = 0; step <= last; step++)); do
  slope=0.05; if [[ "${FAKE_ALGO:-}" == "$ALGO" && "${FAKE_FLAT:-0}" == 1 ]]; then slope=0.01; fi
  acc=$(awk -v slope="$slope" -v step="$step" -v seed="$SEED" 'BEGIN { acc = 0.25 + slope * step + 0.01 * seed; print (acc < 1 ? acc : 1) }')
  echo "{\"step\": $step, \"data\": {\"critic/score/mean\": $acc, \"val-core/tepo_tiny_chain/acc/mean@1\": $acc, \"timing_s/step\": 2.0}}" >> "$RUN_DIR/metrics.jsonl"
done
echo "console of $ALGO seed $SEED" > "$RUN_DIR/console.log"
"""  # noqa: E501  (a bash script: its long lines are its commands)


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    recipe = tmp_path / "fake.sh"
    recipe.write_text(FAKE)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_LOG", str(log))
    for name in ("FAKE_ALGO", "FAKE_FAIL", "FAKE_SHORT", "FAKE_FLAT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(study, "RISE_FROM", 1)  # the gate's rise, from step 1 to the last, in runs of a few steps

    page = tmp_path / "page.md"
    page.write_text(f"# Results\n\nprose before\n\n{CHAIN.page_begin}\nold tables\n{CHAIN.page_end}\n\nprose after\n")

    def run(*args: str, on_log=lambda *_: None) -> tuple[int, list[dict]]:
        before = len(log.read_text().splitlines()) if log.exists() else 0
        code = study.main(["--results-root", str(tmp_path / "results"), "--scratch-root", str(tmp_path / "scratch"),
                           "--recipe", str(recipe), "--page-file", str(page), *args],
                          log=on_log)
        calls = [json.loads(line) for line in log.read_text().splitlines()[before:]] if log.exists() else []
        return code, calls

    return run, tmp_path / "results" / CHAIN.name


CHAIN = study.CHAIN
GATE = ("--arms", "grpo", "--seeds", "1-5", "--steps", "3", "--no-compare")
GATE_RUNS = [f"grpo-seed{seed}" for seed in study.CHECK_SEEDS]


def pass_the_gate(run) -> None:
    """Run the chain study's gate (GRPO's seeds 1-5; the stand-in's curves rise 0.1 from step 1 to 3)."""
    code, calls = run(*GATE)
    assert code == 0 and [c["env"]["SEED"] for c in calls] == ["1", "2", "3", "4", "5"]
ARGS = ("--arms", "tepo,tepo-kl10", "--seeds", "1-2", "--steps", "3", "--no-compare")
KL10 = "actor_rollout_ref.actor.policy_loss.tepo.kl_coef=10.0"


def test_runs_every_arm_and_seed_and_records_what_ran(fake):
    run, results = fake
    pass_the_gate(run)
    code, calls = run(*ARGS)
    assert code == 0
    assert [(c["env"]["ALGO"], c["env"]["SEED"], KL10 in c["args"]) for c in calls] == [
        ("tepo", "1", False), ("tepo", "1", True), ("tepo", "2", False), ("tepo", "2", True)]  # seed-major
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for call in calls:
        env = call["env"]
        assert (env["TASK"], env["PRECISION"], env["N"], env["STEPS"], env["QUIET"], env["COMPARE"]) == (
            "chain", "float32", "8", "3", "1", "0")
        assert int(env["BATCH"]) == 8 * int(env["MINI"])  # 8 PPO updates per step
    assert calls[1]["args"] == [*CHAIN.common_overrides, KL10]
    assert sorted(p.name for p in results.iterdir()) == sorted(["study.json", "tepo-kl10-seed1", "tepo-kl10-seed2",
                                                                "tepo-seed1", "tepo-seed2", *GATE_RUNS])
    for name in ("tepo-seed1", "tepo-kl10-seed2"):
        assert sorted(p.name for p in (results / name).iterdir()) == ["metrics.jsonl.gz", "run.json"]
        record = json.loads((results / name / "run.json").read_text())
        assert record["status"] == "finished" and record["commit"] == head and record["regime"]["STEPS"] == "3"
        assert isinstance(record["changed_tracked_files"], list)
        assert record["seed"] == int(name[-1]) and record["arm"] == name.rsplit("-seed", 1)[0]
        assert "BATCH=32 MINI=4" in record["command"] and f"SEED={record['seed']}" in record["command"]
        assert "bash " in record["command"] and record["command"].endswith(" ".join(record["overrides"]))
        stored = (results / name / "metrics.jsonl.gz").read_bytes()
        written = results.parents[1] / "scratch" / CHAIN.name / name / "metrics.jsonl"  # what the recipe wrote
        assert gzip.decompress(stored) == written.read_bytes()  # compressed, nothing lost
        assert stored[4:8] == bytes(4)  # the gzip header's mtime is 0: the same metrics give the same bytes
        lines = gzip.decompress(stored).decode().splitlines()
        assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3]
    assert json.loads((results / "study.json").read_text())["regime"]["STEPS"] == "3"


def test_resume_skips_finished_runs_and_reruns_the_rest(fake):
    run, results = fake
    pass_the_gate(run)
    assert run(*ARGS)[0] == 0
    code, calls = run(*ARGS)
    assert code == 0 and calls == []  # everything finished: nothing runs
    (results / "tepo-seed2" / "run.json").unlink()  # no record: not finished
    stored = results / "tepo-kl10-seed1" / "metrics.jsonl.gz"
    lines = gzip.decompress(stored.read_bytes()).decode().splitlines()
    stored.write_bytes(gzip.compress(("\n".join(lines[:-1]) + "\n").encode()))  # short of the end
    code, calls = run(*ARGS)
    assert code == 0 and sorted((c["env"]["SEED"], KL10 in c["args"]) for c in calls) == [("1", True), ("2", False)]
    code, calls = run(*ARGS[:2], "--seeds", "1-3", "--steps", "3", "--no-compare")
    assert code == 0 and sorted((c["env"]["SEED"], KL10 in c["args"]) for c in calls) == [("3", False), ("3", True)]


def test_a_failed_or_short_run_leaves_no_record_and_the_others_go_on(fake, monkeypatch):
    run, results = fake
    pass_the_gate(run)
    args = ("--arms", "tepo,gspo", "--seeds", "1-2", "--steps", "3", "--no-compare")
    monkeypatch.setenv("FAKE_ALGO", "gspo")
    monkeypatch.setenv("FAKE_FAIL", "1")
    code, calls = run(*args)
    assert code == 1 and len(calls) == 4
    assert (results / "tepo-seed1" / "run.json").is_file() and (results / "tepo-seed2" / "run.json").is_file()
    assert not (results / "gspo-seed1").exists()
    monkeypatch.setenv("FAKE_FAIL", "0")
    monkeypatch.setenv("FAKE_SHORT", "1")  # exits 0 but stops a step early
    code, calls = run(*args)
    assert code == 1 and [c["env"]["ALGO"] for c in calls] == ["gspo", "gspo"]
    assert not (results / "gspo-seed1").exists()
    monkeypatch.setenv("FAKE_SHORT", "0")
    code, calls = run(*args)
    assert code == 0 and len(calls) == 2 and (results / "gspo-seed2" / "run.json").is_file()


def test_grpos_first_seeds_run_first_and_gate_every_other_run(fake):
    run, results = fake
    args = ("--arms", "tepo,grpo", "--seeds", "1-6", "--steps", "3", "--no-compare")
    code, calls = run(*args)  # the gate alone: nothing else starts before it is finished
    assert code == 0 and [(c["env"]["ALGO"], c["env"]["SEED"]) for c in calls] == [("grpo", s) for s in "12345"]
    assert study.test_bed_passed(results, 3) is True  # rose 0.1 from step 1 to step 3 (RISE_FROM is 1 here)
    assert study.gate_state(results, 3) == "passed, +0.100 from step 1 to step 3"
    code, calls = run(*args)
    assert code == 0 and [(c["env"]["ALGO"], c["env"]["SEED"]) for c in calls] == [
        *(("tepo", s) for s in "12345"), ("tepo", "6"), ("grpo", "6")]


def test_a_test_bed_that_fails_its_check_starts_nothing_more(fake, monkeypatch, capsys):
    run, results = fake
    monkeypatch.setenv("FAKE_ALGO", "grpo")
    monkeypatch.setenv("FAKE_FLAT", "1")  # GRPO rises 0.01 a step: 0.02 from step 1 to 3
    assert study.test_bed_passed(results, 3) is None
    assert study.gate_state(results, 3) == "pending, 0 of 5 runs finished"
    pass_the_gate(run)
    assert study.test_bed_passed(results, 3) is False
    assert study.gate_state(results, 3) == "failed, +0.020 from step 1 to step 3"
    code, calls = run("--arms", "tepo", "--seeds", "1", "--steps", "3", "--no-compare")
    assert code == 2 and calls == []
    assert ("the test bed failed its check: grpo's seeds 1-5 rose +0.020 from step 1 to step 3, under +0.05"
            in capsys.readouterr().err)


def test_a_study_folder_holds_one_regime(fake, capsys):
    run, _ = fake
    pass_the_gate(run)
    code, calls = run("--arms", "grpo", "--seeds", "1", "--steps", "4", "--no-compare")
    assert code == 2 and calls == []
    assert "use another --results-root" in capsys.readouterr().err


def test_ends_with_the_comparisons_and_the_results_page(fake):
    run, results = fake
    pass_the_gate(run)
    code, _ = run("--arms", "tepo,grpo,tepo-kl10", "--seeds", "1-2", "--steps", "3", "--no-plots")
    assert code == 0
    main = (results / "compare" / "main" / "compare.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in main[1:]] == ["grpo", "tepo"]
    dose = (results / "compare" / "dose" / "compare.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in dose[1:]] == ["tepo", "tepo-kl10"]  # no tepo_nomask run to put beside
    page = (results.parents[1] / "page.md").read_text()
    assert page.startswith("# Results\n\nprose before\n\n") and page.endswith("\n\nprose after\n")
    generated = page.split(CHAIN.page_begin)[1].split(CHAIN.page_end)[0]
    assert "old tables" not in generated
    assert generated.count(f"Target validation accuracy: {CHAIN.target:.4f}") == 2
    assert "#### Main arms" in generated and "#### The mask's dose" in generated
    assert (results / "compare" / "main" / "compare.md").read_text().strip() in generated


def test_page_alone_runs_nothing_and_needs_the_markers(fake, capsys):
    run, results = fake
    pass_the_gate(run)
    assert run("--arms", "tepo,grpo", "--seeds", "1", "--steps", "3", "--no-compare")[0] == 0
    page = results.parents[1] / "page.md"
    code, calls = run("--page", "--no-plots")
    both = "".join(f"{s.page_begin}\nold\n{s.page_end}\n" for s in study.STUDIES.values())
    page.write_text(both)
    code, calls = run("--page", "--no-plots")
    text = page.read_text()
    assert code == 0 and calls == [] and "| grpo " in text.split(CHAIN.page_end)[0]
    # the studies without runs of their own arms (the clip band, the scratchpad here) are left as they were; the
    # collapse comparison's part says it waits for its calibration
    assert text.count("\nold\n") == len(study.STUDIES) - 2 and "\nold\n" not in text.split(CHAIN.page_end)[0]
    waiting = text.split(study.MASK_COLLAPSE.page_begin)[1].split(study.MASK_COLLAPSE.page_end)[0]
    assert waiting.strip().startswith("No run yet: the comparison waits for the calibration above (in progress, 0 of")
    page.write_text("no markers\n")
    assert run("--page", "--no-plots") == (2, [])
    assert "has no markers for study" in capsys.readouterr().err


@pytest.mark.parametrize("gain, verdict", [(0.06, "meets"), (0.04, "does not meet")])
def test_the_page_states_the_test_beds_check_on_grpos_seed_mean(tmp_path, gain, verdict):
    steps = int(CHAIN.regime["STEPS"])
    assert study.rise_check(tmp_path, CHAIN) is None  # no GRPO run yet: no line
    for seed, spread in ((1, -0.01), (2, 0.01)):  # flat to step 20, then rising by gain +- 0.01
        _finished_run(tmp_path, f"grpo-seed{seed}", [0.2 + (gain + spread) * max(0, k - 20) / (steps - 20)
                                                     for k in range(steps + 1)], steps=steps)
    _finished_run(tmp_path, "tepo-seed1", [0.9] * (steps + 1), steps=steps)  # another arm: not counted
    _finished_run(tmp_path, "grpo-seed3", [0.9] * 4, steps=3)  # unfinished at the regime's steps: not counted
    assert study.rise_check(tmp_path, CHAIN) == (
        f"**The test bed's check** (grpo, 2 of 10 seeds): the seed-mean validation accuracy is 0.200 at step 20 and "
        f"{0.2 + gain:.3f} at step {steps}, {gain:+.3f}, which {verdict} the calibration's +0.05.")


@pytest.mark.parametrize("name", list(study.STUDIES))
def test_the_committed_results_page_is_what_the_committed_runs_give(tmp_path, name):
    chosen = study.resolved(study.STUDIES[name], REPO / "benchmarks" / "results")
    results = REPO / "benchmarks" / "results" / chosen.results_name
    page = REPO / "docs" / "results.md"
    if not study.group_runs(results, chosen):
        assert not chosen.superseded, f"no committed runs in {results}"
        return  # a current study before its first committed run: the page keeps its placeholder
    compared = study.compare(results, chosen, log=lambda *_: None, plots=False, out_root=tmp_path)
    expected = study.page_section(compared, page, chosen, results)
    text = page.read_text()
    committed = chosen.page_begin + text.split(chosen.page_begin)[1].split(chosen.page_end)[0] + chosen.page_end

    def tables(text: str) -> list[str]:  # without the plots' links, which name where they were written
        return [line for line in text.splitlines() if line and not line.startswith("![")]

    assert tables(committed) == tables(expected)


def test_the_committed_tables_name_their_runs_inside_the_repository():
    """compare_runs.csv names each run as the repository holds it, not where one machine had its checkout."""
    tables = sorted((REPO / "benchmarks" / "results").glob("*/compare/*/compare_runs.csv"))
    assert tables
    for table in tables:
        for row in csv.DictReader(table.open()):
            assert not Path(row["run"]).is_absolute() and (REPO / row["run"]).is_file(), (table, row["run"])


def test_no_committed_run_keeps_its_metrics_uncompressed():
    """benchmarks/results holds each run's metrics as metrics.jsonl.gz only (the runner's store_metrics)."""
    results = REPO / "benchmarks" / "results"
    assert not sorted(results.rglob("*.jsonl")), "uncompressed JSONL under benchmarks/results"
    runs = sorted(path.parent for path in results.glob("*/*/run.json"))
    assert len(runs) >= 100 and all((run / "metrics.jsonl.gz").is_file() for run in runs)


def test_the_runs_readers_read_a_compressed_run_as_its_plain_copy(tmp_path):
    """last_step and finished: the same answer on a run folder with metrics.jsonl and on its compressed copy."""
    for name, accuracies in (("whole", [0.3] * 4), ("short", [0.3] * 3)):  # steps 0-3 and 0-2 of a 3-step regime
        _finished_run(tmp_path / "plain", name, accuracies)
        _finished_run(tmp_path / "gz", name, accuracies, compressed=True)
        plain, packed = tmp_path / "plain" / name, tmp_path / "gz" / name
        assert sorted(p.name for p in packed.iterdir()) == ["metrics.jsonl.gz", "run.json"]
        assert study.last_step(plain / "metrics.jsonl") == study.last_step(packed / "metrics.jsonl.gz") == \
            len(accuracies) - 1
        assert study.finished(plain, 3) == study.finished(packed, 3) == (name == "whole")
    assert study.last_step(tmp_path / "none.jsonl.gz") is None
    packed = gzip.compress("".join(json.dumps({"step": step, "data": {"x": step / 7}}) + "\n"
                                   for step in range(400)).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    assert study.last_step(tmp_path / "cut.jsonl.gz") is None  # a stream cut short: unreadable, not a finished run


def test_the_lock_is_held_during_each_run_and_its_wait_recorded_apart(fake, tmp_path):
    run, results = fake
    lock = tmp_path / "lock"
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # someone else's run
        releaser = threading.Timer(0.4, fcntl.flock, (held, fcntl.LOCK_UN))

        def on_log(line: str) -> None:  # the runner names the run just before it asks for the lock
            if line.startswith("[study] grpo-seed1: TASK="):
                releaser.start()

        began = time.time()
        code, calls = run("--arms", "grpo", "--seeds", "1", "--steps", "2", "--no-compare", "--lock", str(lock),
                          on_log=on_log)
        total = time.time() - began
        releaser.join()
    assert code == 0 and len(calls) == 1
    record = json.loads((results / "grpo-seed1" / "run.json").read_text())
    assert record["lock_wait_s"] >= 0.35 and record["wall_s"] <= total - record["lock_wait_s"] + 0.1
    assert record["command"].startswith("TASK=chain PRECISION=float32 ") and "flock" not in record["command"]
    with open(lock, "a") as again:  # released after the run
        fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)


# ------------------------------------------------------------------------------------------------- the plan

def test_the_chain_plan_has_ten_seeds_of_each_main_arm_five_of_each_dose_and_control_arm():
    main = [a.name for a in CHAIN.arms if a.group == "main"]
    assert main == ["tepo", "tepo_nomask", "gspo", "grpo", "dapo"]
    assert CHAIN.seeds == {"main": tuple(range(1, 11)), "dose": (1, 2, 3, 4, 5), "control": (1, 2, 3, 4, 5)}
    dose = {a.name: a.overrides for a in CHAIN.arms if a.group == "dose"}
    assert dose == {"tepo-kl10": (f"{study.TEPO}.kl_coef=10.0",), "tepo-kl100": (f"{study.TEPO}.kl_coef=100.0",)}
    assert CHAIN.regime["PRECISION"] == "float32" and CHAIN.regime["TASK"] == "chain"
    # 32 prompts per step in 8 updates; validation sampled at temperature 1 (the plan's primary metric is on it)
    assert (CHAIN.regime["BATCH"], CHAIN.regime["MINI"], CHAIN.regime["STEPS"]) == ("32", "4", "80")
    assert {"actor_rollout_ref.rollout.val_kwargs.do_sample=True",
            "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"} <= set(CHAIN.common_overrides)
    runs = study.plan(list(study.study_arms(CHAIN, 10.0)), None, CHAIN)
    assert len(runs) == 75 and len({r.name for r in runs}) == 75
    assert [r.name for r in runs[:5]] == GATE_RUNS  # the test bed's check first
    # seeds 1-5 of the main and dose arms first, then the controls, then the main arms' seeds 6-10
    groups = [(r.arm.group != "control", r.seed <= 5) for r in runs]
    assert groups == [(True, True)] * 35 + [(False, True)] * 15 + [(True, False)] * 25
    assert all(f"{study.TEPO}.kl_coef=10.0" in r.arm.overrides for r in runs if r.arm.group == "control")
    assert study.parse_seeds("1-3,7") == (1, 2, 3, 7)
    for bad in ("0-2", "3-1", "x", ","):
        with pytest.raises(study.StudyError):
            study.parse_seeds(bad)
    with pytest.raises(study.StudyError, match="unknown arm 'ppo'"):
        study.select_arms("tepo,ppo", CHAIN.arms, CHAIN.seeds)


def _finished_run(results: Path, name: str, accuracies: list[float], steps: int = 3,
                  compressed: bool = False) -> None:
    """A finished run folder whose validation accuracy at steps 0..steps is `accuracies`; its metrics as verl writes
    them (metrics.jsonl) or, `compressed`, as the runner stores them (metrics.jsonl.gz)."""
    folder = results / name
    folder.mkdir(parents=True)
    lines = [json.dumps({"step": step, "data": {"val-core/tepo_tiny_chain/acc/mean@1": acc}})
             for step, acc in zip(range(steps + 1), accuracies)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if compressed:
        study.store_metrics(folder / "metrics.jsonl", folder)
    (folder / "run.json").write_text(json.dumps({"status": "finished", "regime": {"STEPS": str(steps)}}))


@pytest.mark.parametrize("aucs, chosen", [((0.3, 0.4, 0.2), 10.0), ((0.5, 0.4, 0.45), 1.0), ((0.3, 0.3, 0.6), 100.0),
                                          ((0.4, 0.4, 0.2), 1.0)])  # a tie goes to the smaller coefficient
@pytest.mark.parametrize("compressed", [False, True])
def test_the_controls_take_the_dose_with_the_highest_mean_auc(tmp_path, aucs, chosen, compressed):
    for arm, auc in zip(study.DOSE_LEVELS.values(), aucs):
        for seed in study.DOSE_SEEDS:
            spread = 0.02 * (seed - 3)  # the seeds differ; their mean is the arm's AUC
            _finished_run(tmp_path, f"{arm}-seed{seed}", [auc + spread] * 4, compressed=compressed)
    assert study.control_coef(tmp_path, 3) == chosen
    (tmp_path / "tepo-kl100-seed5" / "run.json").unlink()  # one dose run unfinished: no coefficient yet
    assert study.control_coef(tmp_path, 3) is None


def test_the_controls_wait_for_the_dose_arms_then_run_at_the_chosen_coefficient(fake):
    run, results = fake
    code, calls = run("--arms", "control", "--steps", "3", "--no-compare")
    assert code == 0 and calls == []
    for coef, arm in study.DOSE_LEVELS.items():
        for seed in study.DOSE_SEEDS:
            _finished_run(results, f"{arm}-seed{seed}", [0.5 if coef == 100.0 else 0.3] * 4)
    pass_the_gate(run)
    code, calls = run("--arms", "control", "--seeds", "1", "--steps", "3", "--no-compare")
    assert code == 0 and len(calls) == 3
    assert all(call["args"][-1] == f"{study.TEPO}.kl_coef=100.0" for call in calls)


def test_a_superseded_study_takes_no_new_runs(fake, capsys):
    run, _ = fake
    code, calls = run("--study", "cpu-scratchpad", "--arms", "tepo", "--seeds", "1", "--no-compare")
    assert code == 2 and calls == [] and "superseded" in capsys.readouterr().err


@pytest.mark.parametrize("name", [name for name, one in study.STUDIES.items() if not one.superseded])
def test_every_arm_composes_with_verl_and_sets_its_overrides(name):
    """Each arm's preset + overrides compose in verl's real config, and the actor dataclass carries them (the
    studies that can still run: a superseded one refuses new runs, its arms' commands are in its runs' run.json)."""
    from omegaconf import OmegaConf
    from verl_config import actor_of, compose_config

    chosen = study.STUDIES[name]
    # the collapse comparison's arms at each level the calibration may meet
    every = ([study.mask_collapse_study(level) for level in study.COLLAPSE_LEVELS] if chosen is study.MASK_COLLAPSE
             else [chosen])
    for arm in (arm for one in every for arm in study.study_arms(one, 10.0)):
        overrides = [f"+algorithm={arm.preset}", *chosen.common_overrides, *arm.overrides]
        config = compose_config(overrides)
        actor_of(config)  # verl validates the actor config (clip ranges, loss mode, the tepo block)
        for override in (*chosen.common_overrides, *arm.overrides):
            key, value = override.split("=", 1)
            node = OmegaConf.select(config, key.lstrip("+"))
            shown = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
            # a mapping override ({k:v,...}) against the composed node, compared without quotes and spaces
            assert str(shown).lower().translate(str.maketrans("", "", "' ")) == value.lower(), (arm.name, key)


def test_list_prints_the_plan_and_runs_nothing(tmp_path):
    lines: list[str] = []
    code = study.main(["--list", "--results-root", str(tmp_path)], log=lines.append)
    assert code == 0 and not any(tmp_path.iterdir())
    assert len(lines) == 2 + len(CHAIN.arms) + len(study.CONTROL_TEMPLATES)  # the regime, the check, the arms
    assert lines[1].endswith("pending, 0 of 5 runs finished")
    assert "ctl-top20" in lines[-1] and "kl_coef pending" in lines[-1]


def test_git_state_names_the_commit_and_the_changed_tracked_files(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "bench").mkdir()
    for name in ("bench/a.py", "b.py"):
        (tmp_path / name).write_text("x\n")
    git("add", "bench/a.py", "b.py")
    git("commit", "-q", "-m", "c")
    head = git("rev-parse", "HEAD")
    assert study.git_state(tmp_path) == {"commit": head, "changed_tracked_files": []}
    (tmp_path / "bench" / "a.py").write_text("y\n")
    (tmp_path / "new.py").write_text("untracked\n")
    assert study.git_state(tmp_path) == {"commit": head, "changed_tracked_files": ["bench/a.py"]}


def _call(differences, low, high, p, planned=5, arm="tepo-kl10", reference="tepo") -> study.Call:
    return study.Call(reference, arm, tuple(differences), planned, sum(differences) / len(differences), low, high, p)


@pytest.mark.parametrize("differences, low, high, p, planned, word", [
    ([0.01] * 10, 0.005, 0.015, 0.002, 10, "supported"),
    ([0.01] * 9 + [-0.01], 0.001, 0.012, 0.021, 10, "supported"),  # one seed against: still p < 0.05
    ([0.01] * 9 + [-0.01], -0.001, 0.012, 0.021, 10, "null"),  # the interval includes 0
    ([0.01] * 5 + [-0.01] * 5, -0.01, 0.01, 1.0, 10, "null"),
    ([-0.02] * 5, -0.03, -0.01, 0.0625, 5, "consistent"),
    ([-0.02] * 4 + [0.001], -0.03, -0.001, 0.125, 5, "null"),  # one seed of the other sign
    ([0.0] + [0.02] * 4, 0.004, 0.02, 0.125, 5, "null"),  # a tie is not the same sign
    ([0.02] * 4, 0.01, 0.03, 0.125, 5, "pending"),  # fewer pairs than planned
    ([0.02] * 9, 0.01, 0.03, 0.004, 10, "pending"),
])
def test_the_plans_call_on_one_comparison(differences, low, high, p, planned, word):
    assert _call(differences, low, high, p, planned).word == word


@pytest.mark.parametrize("differences, low, high, p, planned, ahead", [
    ([0.01] * 10, 0.005, 0.015, 0.002, 10, "tepo"),  # supported, the reference higher
    ([-0.01] * 10, -0.015, -0.005, 0.002, 10, "tepo-kl10"),  # supported, the arm higher
    ([-0.02] * 5, -0.03, -0.01, 0.0625, 5, "tepo-kl10"),  # consistent
    ([0.01] * 9 + [-0.01], -0.001, 0.012, 0.021, 10, "-"),  # null
    ([0.02] * 4, 0.01, 0.03, 0.125, 5, "-"),  # pending
])
def test_a_call_names_the_arm_ahead_only_where_it_is_supported_or_consistent(differences, low, high, p, planned,
                                                                            ahead):
    call = _call(differences, low, high, p, planned)
    assert call.ahead == ahead and call.favours_arm == (ahead == call.arm)


def test_the_plans_decisions_follow_its_rules():
    nomask = _call([0.01, -0.01] * 5, -0.01, 0.01, 1.0, 10, "tepo_nomask")
    kl10 = _call([-0.02] * 5, -0.03, -0.01, 0.0625)  # kl 10 higher than tepo on every seed
    kl100 = _call([-0.04] * 5, -0.05, -0.03, 0.0625, arm="tepo-kl100")  # higher still
    worse = _call([0.04] * 5, 0.03, 0.05, 0.0625, arm="tepo-kl100")  # consistent, but in tepo's favour
    decided = study.plan_decisions({"main": [nomask], "dose": [kl10, kl100]})
    assert decided[0].startswith("- **The mask's benefit is not established on this test bed** (`tepo` minus "
                                 "`tepo_nomask`: +0.0000 [-0.0100, +0.0100], p = 1)")
    assert decided[1].startswith("- **`kl_coef`** changes to 100 ")  # both qualify: the larger difference
    assert study.plan_decisions({"dose": [kl10, worse]})[1].startswith("- **`kl_coef`** changes to 10 ")
    assert study.plan_decisions({"dose": [worse, _call([-0.02] * 4 + [0.01], -0.03, 0.0, 0.19)]})[1] == (
        "- **`kl_coef`** stays 1: no dose arm beats `tepo` on all 5 paired seeds with an interval that excludes 0.")
    assert "pending" in study.plan_decisions({"dose": [kl10, _call([-0.02] * 4, -0.03, -0.01, 0.125)]})[1]
    assert "pending" in study.plan_decisions({"dose": [kl10]})[1]  # the other dose arm has no run yet
    controls = [_call([-0.02] * 5, -0.03, -0.01, 0.0625, arm="ctl-top20", reference="tepo-kl10"),
                *(_call([0.02] * 5, 0.01, 0.03, 0.0625, arm=arm, reference="tepo-kl10")
                  for arm in ("ctl-positive", "ctl-every"))]
    assert study.plan_decisions({"control": controls})[2] == "- **The mask's selection**: changes to `ctl-top20`'s."
    assert "pending" in study.plan_decisions({"control": controls[:2]})[2]
    assert "pending" in study.plan_decisions({})[0]


def test_the_plans_calls_are_read_from_the_comparisons_runs(tmp_path):
    """Through the real `tepo-verl compare`: per-seed differences of the primary metric, its call, and the page."""
    steps = 3
    for seed in study.DOSE_SEEDS:
        _finished_run(tmp_path, f"tepo-seed{seed}", [0.3] * (steps + 1), steps)
        _finished_run(tmp_path, f"tepo_nomask-seed{seed}", [0.3 - 0.001 * seed] * (steps + 1), steps)
        _finished_run(tmp_path, f"tepo-kl10-seed{seed}", [0.35 + 0.01 * seed] * (steps + 1), steps)  # higher
    compared = study.compare(tmp_path, CHAIN, log=lambda *_: None, plots=False)
    calls = study.plan_calls(compared, CHAIN)
    (kl10,) = calls["dose"]  # tepo_nomask sits beside the dose arms, and is called in the main comparison only
    assert kl10.arm == "tepo-kl10" and kl10.planned == 5 and kl10.word == "consistent"
    assert kl10.differences == pytest.approx([-0.05 - 0.01 * seed for seed in study.DOSE_SEEDS])
    assert kl10.p == pytest.approx(0.0625) and kl10.high < 0
    (nomask,) = calls["main"]
    assert nomask.differences == pytest.approx([0.001 * seed for seed in study.DOSE_SEEDS])
    assert nomask.planned == 10 and nomask.word == "pending"
    section = "\n".join(study.calls_section(calls))
    assert "| tepo | tepo-kl10 | 5 of 5 | -0.0800 |" in section and "| consistent | tepo-kl10 |" in section
    assert "- **`kl_coef`**: pending (the dose arms' seeds 1-5)." in section  # tepo-kl100 has no run


def test_a_comparison_that_compare_refuses_ends_the_study_with_its_error_line(tmp_path):
    """compare's one-line error (here a metrics line that is not JSON) ends the study as a StudyError naming the
    comparison, and the working folder is restored."""
    for seed in (1, 2):
        _finished_run(tmp_path, f"tepo-seed{seed}", [0.3] * 4)
        _finished_run(tmp_path, f"tepo_nomask-seed{seed}", [0.3] * 4)
    with (tmp_path / "tepo-seed2" / "metrics.jsonl").open("a") as metrics:
        metrics.write("not json\n")
    cwd = os.getcwd()
    with pytest.raises(study.StudyError, match=r"^tepo-verl compare failed for the cpu-chain main runs: "
                                               r"tepo-verl compare: error: .*tepo-seed2.*metrics\.jsonl"):
        study.compare(tmp_path, CHAIN, log=lambda *_: None, plots=False)
    assert os.getcwd() == cwd


def test_a_run_cut_short_leaves_no_process_of_its_own_behind(tmp_path):
    """The recipe starts verl's driver, which starts Ray and vLLM: on a timeout the whole process group goes, not
    only the recipe's shell (a leftover trainer once kept training beside the next run)."""
    pid_file = tmp_path / "child.pid"
    recipe = tmp_path / "recipe.sh"
    recipe.write_text(f"#!/usr/bin/env bash\nsleep 300 &\necho $! > {pid_file}\nwait\n")
    began = time.time()
    with open(tmp_path / "recipe.log", "w") as log:
        code = study.run_recipe(["bash", str(recipe)], dict(os.environ), log, timeout=2)
    assert code == "timeout" and time.time() - began < 30
    child = int(pid_file.read_text())
    deadline = time.time() + 10
    while Path(f"/proc/{child}").exists() and time.time() < deadline:  # killed; reaped by init shortly after
        state = Path(f"/proc/{child}/stat").read_text().split()[2] if Path(f"/proc/{child}/stat").exists() else "X"
        if state == "Z":
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists() or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
    with open(tmp_path / "recipe.log", "w") as log:  # a normal exit gives the recipe's own code
        assert study.run_recipe(["bash", "-c", "exit 3"], dict(os.environ), log, timeout=10) == 3
