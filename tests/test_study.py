"""benchmarks/study.py: the plan (arms, seeds, regime), and the runner's records, skipping and resuming, with a
stand-in recipe (no training)."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("study", REPO / "benchmarks" / "study.py")
study = importlib.util.module_from_spec(_spec)
sys.modules["study"] = study
_spec.loader.exec_module(study)

#: Stands in for recipes/cpu.sh: logs its environment and arguments, then writes a file-logger JSONL of STEPS steps
#: into $RUN_DIR (fewer with FAKE_SHORT=1 for the arm FAKE_ALGO; exit 1 with FAKE_FAIL=1 for that arm).
FAKE = r"""#!/usr/bin/env bash
set -euo pipefail
printf '%s\n' "$(python -c 'import json, os, sys; print(json.dumps({"env": {k: os.environ.get(k) for k in ("TASK", "N", "BATCH", "MINI", "STEPS", "TEST_FREQ", "ALGO", "SEED", "RUN_DIR", "QUIET", "COMPARE")}, "args": sys.argv[1:]}))' "$@")" >> "$FAKE_LOG"
last=$STEPS
if [[ "${FAKE_ALGO:-}" == "$ALGO" && "${FAKE_FAIL:-0}" == 1 ]]; then exit 1; fi
if [[ "${FAKE_ALGO:-}" == "$ALGO" && "${FAKE_SHORT:-0}" == 1 ]]; then last=$((STEPS - 1)); fi
for ((step = 0; step <= last; step++)); do
  acc=$(python -c "print(min(1.0, 0.25 + 0.05 * $step + 0.01 * $SEED))")
  echo "{\"step\": $step, \"data\": {\"critic/score/mean\": $acc, \"val-core/tepo_tiny_scratchpad/acc/mean@1\": $acc, \"timing_s/step\": 2.0}}" >> "$RUN_DIR/metrics.jsonl"
done
echo "console of $ALGO seed $SEED" > "$RUN_DIR/console.log"
"""


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    recipe = tmp_path / "fake.sh"
    recipe.write_text(FAKE)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_LOG", str(log))
    for name in ("FAKE_ALGO", "FAKE_FAIL", "FAKE_SHORT"):
        monkeypatch.delenv(name, raising=False)

    page = tmp_path / "page.md"
    page.write_text(f"# Results\n\nprose before\n\n{study.PAGE_BEGIN}\nold tables\n{study.PAGE_END}\n\nprose after\n")

    def run(*args: str) -> tuple[int, list[dict]]:
        before = len(log.read_text().splitlines()) if log.exists() else 0
        code = study.main(["--results-root", str(tmp_path / "results"), "--scratch-root", str(tmp_path / "scratch"),
                           "--recipe", str(recipe), "--study", "s", "--page-file", str(page), *args],
                          log=lambda *_: None)
        calls = [json.loads(line) for line in log.read_text().splitlines()[before:]] if log.exists() else []
        return code, calls

    return run, tmp_path / "results" / "s"


ARGS = ("--arms", "tepo,gspo-clip3e-3", "--seeds", "1-2", "--steps", "3", "--no-compare")


def test_runs_every_arm_and_seed_and_records_what_ran(fake):
    run, results = fake
    code, calls = run(*ARGS)
    assert code == 0
    assert [(c["env"]["ALGO"], c["env"]["SEED"]) for c in calls] == [("tepo", "1"), ("gspo", "1"), ("tepo", "2"),
                                                                       ("gspo", "2")]  # seed-major: paired early
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for call in calls:
        env = call["env"]
        assert (env["TASK"], env["N"], env["STEPS"], env["QUIET"], env["COMPARE"]) == ("scratchpad", "8", "3", "1", "0")
        assert int(env["BATCH"]) == 8 * int(env["MINI"])  # 8 PPO updates per step
    gspo = [c for c in calls if c["env"]["ALGO"] == "gspo"][0]["args"]
    assert gspo == [*study.COMMON_OVERRIDES, "actor_rollout_ref.actor.clip_ratio=0.003",
                    "actor_rollout_ref.actor.clip_ratio_low=0.003", "actor_rollout_ref.actor.clip_ratio_high=0.004"]
    assert sorted(p.name for p in results.iterdir()) == ["gspo-clip3e-3-seed1", "gspo-clip3e-3-seed2", "study.json",
                                                         "tepo-seed1", "tepo-seed2"]
    for name in ("tepo-seed1", "gspo-clip3e-3-seed2"):
        assert sorted(p.name for p in (results / name).iterdir()) == ["metrics.jsonl", "run.json"]
        record = json.loads((results / name / "run.json").read_text())
        assert record["status"] == "finished" and record["commit"] == head and record["regime"]["STEPS"] == "3"
        assert isinstance(record["changed_tracked_files"], list)
        assert record["seed"] == int(name[-1]) and record["arm"] == name.rsplit("-seed", 1)[0]
        assert "BATCH=8" in record["command"] and f"SEED={record['seed']}" in record["command"]
        assert "bash " in record["command"] and record["command"].endswith(" ".join(record["overrides"]))
        lines = (results / name / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3]
    assert json.loads((results / "study.json").read_text())["regime"]["STEPS"] == "3"


def test_resume_skips_finished_runs_and_reruns_the_rest(fake):
    run, results = fake
    assert run(*ARGS)[0] == 0
    code, calls = run(*ARGS)
    assert code == 0 and calls == []  # everything finished: nothing runs
    (results / "tepo-seed2" / "run.json").unlink()  # no record: not finished
    lines = (results / "gspo-clip3e-3-seed1" / "metrics.jsonl").read_text().splitlines()
    (results / "gspo-clip3e-3-seed1" / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # short of the end
    code, calls = run(*ARGS)
    assert code == 0 and sorted((c["env"]["ALGO"], c["env"]["SEED"]) for c in calls) == [("gspo", "1"), ("tepo", "2")]
    code, calls = run(*ARGS[:4], "--seeds", "1-3", "--steps", "3", "--no-compare")
    assert code == 0 and sorted((c["env"]["ALGO"], c["env"]["SEED"]) for c in calls) == [("gspo", "3"), ("tepo", "3")]


def test_a_failed_or_short_run_leaves_no_record_and_the_others_go_on(fake, monkeypatch):
    run, results = fake
    monkeypatch.setenv("FAKE_ALGO", "gspo")
    monkeypatch.setenv("FAKE_FAIL", "1")
    code, calls = run(*ARGS)
    assert code == 1 and len(calls) == 4
    assert (results / "tepo-seed1" / "run.json").is_file() and (results / "tepo-seed2" / "run.json").is_file()
    assert not (results / "gspo-clip3e-3-seed1").exists()
    monkeypatch.setenv("FAKE_FAIL", "0")
    monkeypatch.setenv("FAKE_SHORT", "1")  # exits 0 but stops a step early
    code, calls = run(*ARGS)
    assert code == 1 and [c["env"]["ALGO"] for c in calls] == ["gspo", "gspo"]
    assert not (results / "gspo-clip3e-3-seed1").exists()
    monkeypatch.setenv("FAKE_SHORT", "0")
    code, calls = run(*ARGS)
    assert code == 0 and len(calls) == 2 and (results / "gspo-clip3e-3-seed2" / "run.json").is_file()


def test_a_study_folder_holds_one_regime(fake, capsys):
    run, _ = fake
    assert run(*ARGS)[0] == 0
    code, calls = run("--arms", "tepo", "--seeds", "1", "--steps", "4", "--no-compare")
    assert code == 2 and calls == []
    assert "use another --study" in capsys.readouterr().err


def test_ends_with_the_comparisons_and_the_results_page(fake):
    run, results = fake
    code, _ = run("--arms", "tepo,grpo,tepo-kl10", "--seeds", "1-2", "--steps", "3", "--no-plots")
    assert code == 0
    main = (results / "compare" / "main" / "compare.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in main[1:]] == ["grpo", "tepo"]
    ablations = (results / "compare" / "ablations" / "compare.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in ablations[1:]] == ["tepo", "tepo-kl10"]  # no gspo run to put beside
    page = (results.parents[1] / "page.md").read_text()
    assert page.startswith("# Results\n\nprose before\n\n") and page.endswith("\n\nprose after\n")
    generated = page.split(study.PAGE_BEGIN)[1].split(study.PAGE_END)[0]
    assert "old tables" not in generated
    assert generated.count(f"Target validation accuracy: {study.STUDY_TARGET:.4f}") == 2
    assert "#### Main arms" in generated and "#### TEPO ablations" in generated
    assert (results / "compare" / "main" / "compare.md").read_text().strip() in generated


def test_page_alone_runs_nothing_and_needs_the_markers(fake, capsys):
    run, results = fake
    assert run("--arms", "tepo,grpo", "--seeds", "1", "--steps", "3", "--no-compare")[0] == 0
    page = results.parents[1] / "page.md"
    code, calls = run("--page", "--no-plots")
    assert code == 0 and calls == [] and "| grpo " in page.read_text()
    page.write_text("no markers\n")
    assert run("--page", "--no-plots") == (2, [])
    assert "has no study markers" in capsys.readouterr().err


def test_the_committed_results_page_is_what_the_committed_runs_give(tmp_path):
    results = REPO / "benchmarks" / "results" / study.DEFAULT_STUDY
    page = REPO / "docs" / "results.md"
    assert study.group_runs(results), f"no committed study runs in {results}"
    compared = study.compare(results, sys.executable, log=lambda *_: None, plots=False, out_root=tmp_path)
    expected = study.page_section(compared, page)
    committed = study.PAGE_BEGIN + page.read_text().split(study.PAGE_BEGIN)[1].split(study.PAGE_END)[0] + study.PAGE_END

    def tables(text: str) -> list[str]:  # without the plots' links, which name where they were written
        return [line for line in text.splitlines() if line and not line.startswith("![")]

    assert tables(committed) == tables(expected)


def test_the_lock_is_held_during_each_run_and_its_wait_recorded_apart(fake, tmp_path):
    run, results = fake
    lock = tmp_path / "lock"
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # someone else's run
        releaser = threading.Timer(1.0, fcntl.flock, (held, fcntl.LOCK_UN))
        releaser.start()
        began = time.time()
        code, calls = run("--arms", "tepo", "--seeds", "1", "--steps", "2", "--no-compare", "--lock", str(lock))
        total = time.time() - began
        releaser.join()
    assert code == 0 and len(calls) == 1
    record = json.loads((results / "tepo-seed1" / "run.json").read_text())
    assert record["lock_wait_s"] >= 0.9 and record["wall_s"] <= total - record["lock_wait_s"] + 0.1
    assert record["command"].startswith("TASK=scratchpad ") and "flock" not in record["command"]
    with open(lock, "a") as again:  # released after the run
        fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)


# ------------------------------------------------------------------------------------------------- the plan

def test_plan_has_the_main_arms_with_five_seeds_and_the_ablations():
    main = [a.name for a in study.ARMS if a.group == "main"]
    assert main == ["tepo", "tepo_nomask", "gspo", "grpo", "dapo"]
    assert study.SEEDS["main"] == (1, 2, 3, 4, 5) and len(study.SEEDS["ablation"]) >= 2
    runs = study.plan(study.select_arms("all"), None)
    ablations = [a for a in study.ARMS if a.group == "ablation"]
    precision = [a.name for a in study.ARMS if a.group == "precision"]
    assert precision == ["tepo-fp32", "gspo-fp32"] and study.SEEDS["precision"] == (1, 2, 3, 4, 5)
    assert len(runs) == 5 * 5 + len(ablations) * len(study.SEEDS["ablation"]) + 2 * 5
    assert len({r.name for r in runs}) == len(runs)
    clip = lambda preset: {a.name.split("-", 1)[1] for a in study.ARMS if a.preset == preset and "clip" in a.name}  # noqa: E731
    assert clip("tepo") == clip("gspo") != set()  # GSPO gets the same clip sweep
    rules = {o.split("=")[1] for a in study.ARMS for o in a.overrides if ".mask_rule=" in o}
    assert rules == {"surprisal", "old"}  # surprisal_old is the tepo arm
    assert study.parse_seeds("1-3,7") == (1, 2, 3, 7)
    for bad in ("0-2", "3-1", "x", ","):
        with pytest.raises(study.StudyError):
            study.parse_seeds(bad)
    with pytest.raises(study.StudyError, match="unknown arm 'ppo'"):
        study.select_arms("tepo,ppo")


def test_every_arm_composes_with_verl_and_sets_its_overrides():
    """Each arm's preset + overrides compose in verl's real config, and the actor dataclass carries them."""
    from omegaconf import OmegaConf
    from verl_config import actor_config, compose_config

    for arm in study.ARMS:
        overrides = [f"+algorithm={arm.preset}", *study.COMMON_OVERRIDES, *arm.overrides]
        config = compose_config(overrides)
        actor_config(overrides)  # verl validates the actor config (clip ranges, loss mode, the tepo block)
        for override in (*study.COMMON_OVERRIDES, *arm.overrides):
            key, value = override.split("=", 1)
            node = OmegaConf.select(config, key.lstrip("+"))
            shown = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
            # a mapping override ({k:v,...}) against the composed node, compared without quotes and spaces
            assert str(shown).lower().translate(str.maketrans("", "", "' ")) == value.lower(), (arm.name, key)


def test_list_prints_the_plan_and_runs_nothing(tmp_path):
    lines: list[str] = []
    code = study.main(["--list", "--results-root", str(tmp_path)], log=lines.append)
    assert code == 0 and not any(tmp_path.iterdir())
    assert len(lines) == 1 + len(study.ARMS) and "tepo-mask_old" in "\n".join(lines)


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
