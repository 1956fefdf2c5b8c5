"""End to end, verl's real trainer on CPU (recipes/cpu.sh): a preempted run resumed from its checkpoint, and TEPO's
on-policy invariants, on one run.

- Preempted and resumed: the run saves a checkpoint at step 2 of 4 and is killed with everything it started, as a
  preemption does, then runs again into the same folder and resumes to step 4. Its metrics (two segments) hold
  steps 1-4 once each, and compare's row has the steps and validations of an uninterrupted run.
- On-policy: one mini-batch per step (current == old policy), the current entropy computed and the literal `old`
  mask rule, where the algorithm's invariants must hold exactly on every step of both segments. Exactly is a CPU
  property: here the old-log-prob pass and the update compute bit-identical log-probs and entropies. On a GPU they
  do not (bf16 lm-head, different micro-batch packings, non-deterministic kernels); the tolerance a GPU run must
  meet is in the docstring of test_on_policy_invariants_hold_exactly.

Both parts run on the pytest run's Ray head (tests/conftest_e2e.py), and each holds $TEPO_TRAIN_LOCK. About 4
minutes on 2 cores. Marked `e2e`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest_e2e  # noqa: E402
from conftest_e2e import (  # noqa: E402
    REPO,
    assert_step_updated,
    metric,
    processes_mentioning,
    recipe_env,
    run_recipe,
    stop_processes,
    training_lock,
)

from tepo_verl.report.compare import run_row  # noqa: E402
from tepo_verl.report.runs import load_run, load_runs, segments  # noqa: E402

pytestmark = pytest.mark.e2e

ALGO = "tepo"
STEPS = 4
BATCH = 4  # the recipe's default prompts per step
TRAINING = "critic/score/mean"  # logged at every training step (not by a validation)
MASK = "actor_rollout_ref.actor.policy_loss.tepo.mask_rule"
#: Both parts: a checkpoint every 2 steps, one mini-batch per step with the current entropy and the `old` mask rule.
OVERRIDES = ("trainer.save_freq=2", "actor_rollout_ref.actor.calculate_entropy=True", f"{MASK}=old")
ENV = {"TEST_FREQ": "2", "MINI": str(BATCH)}


@pytest.fixture(scope="module", autouse=True)
def cpu_stack():
    conftest_e2e.require_cpu_stack()


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _steps(run) -> tuple[list[int], list[int]]:
    """(training steps, validated steps) of a loaded run."""
    return [s for s, m in run.metrics.items() if TRAINING in m], [s for s, _ in run.val_accuracy()]


def _preempted_run(run_dir: Path) -> None:
    """Start recipes/cpu.sh; once step 2 is logged (after its checkpoint is saved), kill it and everything it started,
    as a preemption does."""
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = run_dir / "metrics.jsonl"
    with training_lock():
        env = recipe_env(run_dir, ALGO, STEPS, QUIET="1", **ENV)
        proc = subprocess.Popen(["bash", str(REPO / "recipes" / "cpu.sh"), *OVERRIDES], env=env, cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + int(os.environ.get("TEPO_E2E_TIMEOUT", "900"))
            while not any(r["step"] == 2 and TRAINING in r["data"] for r in _records(metrics)):
                if proc.poll() is not None:
                    pytest.fail(f"the run ended (rc={proc.returncode}) before step 2:\n"
                                f"{(run_dir / 'console.log').read_text()[-3000:]}", pytrace=False)
                if time.monotonic() > deadline:
                    pytest.fail("no step 2 before the timeout", pytrace=False)
                time.sleep(1)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            stop_processes(processes_mentioning(str(run_dir)))  # Ray's workers carry the run folder in their env


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """The run killed after step 2 and resumed; `records` are the training steps of both segments, in order (a step
    in both: the later segment's, as `tepo-verl compare` reads it)."""
    run_dir = tmp_path_factory.mktemp("resumed") / f"{ALGO}-seed1"
    _preempted_run(run_dir)
    checkpointed = (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip()
    resumed = run_recipe(run_dir, ALGO, STEPS, *OVERRIDES, **ENV)
    metrics = run_dir / "metrics.jsonl"
    parts = [_records(path) for path in segments(metrics)]
    by_step = {r["step"]: r for part in parts for r in part if TRAINING in r["data"]}
    records = [by_step[step] for step in sorted(by_step)]
    return {**resumed, "checkpointed": checkpointed, "segments": segments(metrics), "parts": parts,
            "records": records}


# ------------------------------------------------------------------ preempted and resumed

def test_a_preempted_run_resumes_without_losing_metrics(resumed_run):
    run_dir = resumed_run["dir"]
    assert resumed_run["checkpointed"] == "2"  # the killed run had saved its checkpoint at step 2
    assert "resuming: kept the metrics so far as metrics.segment-1.jsonl" in resumed_run["console"]
    metrics = run_dir / "metrics.jsonl"
    assert resumed_run["segments"] == [run_dir / "metrics.segment-1.jsonl", metrics]
    first, second = resumed_run["parts"]
    assert {r["step"] for r in first if TRAINING in r["data"]} >= {1, 2}  # what the killed run logged
    assert [r["step"] for r in second if TRAINING in r["data"]] == [3, 4]  # resumed after the checkpoint at 2
    joined = load_run(metrics)
    # every step once, in order, and the validations of an uninterrupted run: before training, every 2 steps
    assert _steps(joined) == ([1, 2, 3, 4], [0, 2, 4])
    row = run_row(joined, 0.5)
    assert (row["steps"], row["validations"]) == (4, 3)
    assert load_runs([str(run_dir.parent)])[0].path == metrics  # one run, not one per segment


# ------------------------------------------------------------------ one mini-batch per step: current == old

def test_on_policy_invariants_hold_exactly(resumed_run):
    """With one PPO mini-batch per step the update sees the policy that generated the data (current == old):
    the sequence ratio is exactly 1, the current entropy equals the stored old one (entropy change 0, so the two
    passes are aligned token for token), the literal `old` mask (H < H_old) is empty and the masked KL is 0, on the
    steps before the preemption and after the resume alike.

    These equalities are CPU-exact properties: on CPU both passes compute bit-identical numbers. On a GPU the
    on-policy update sees 1 plus numerical noise, and a healthy GPU run must keep that noise well inside the clip
    range: on the on-policy update, |log seq_ratio| <= 3e-5 for every response (seq_ratio_min/max within
    1 +- 3e-5, a tenth of the 3e-4 clip, `tepo-verl doctor`'s threshold), seq_clipfrac 0, ppo_kl within +-3e-5,
    and |entropy_delta| a small fraction of the entropy (<= 1e-3 of it); the literal `old` mask is then not empty
    (noise makes H < H_old true on about half the tokens), which is why it needs a tolerance on a GPU.
    benchmarks/gpu_check.py measures this noise on a GPU."""
    records = resumed_run["records"]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        data, step = record["data"], record["step"]
        assert metric(data, "tepo/mask_rule/old") == 1.0, step
        assert metric(data, "tepo/mask_fallback_used") == 0.0, step
        for name in ("tepo/seq_ratio_mean", "tepo/seq_ratio_min", "tepo/seq_ratio_max"):
            assert metric(data, name) == 1.0, (step, name, metric(data, name))
        assert metric(data, "tepo/entropy_delta") == 0.0, step
        assert metric(data, "tepo/surprisal_disagreement") == 0.0, step  # surprisal == surprisal_old on-policy
        assert metric(data, "tepo/entropy") > 0.0, step  # the current entropy was computed (not a zero fill)
        assert metric(data, "tepo/mask_frac") == 0.0, step
        assert metric(data, "tepo/masked_kl_mean") == 0.0, step
        assert metric(data, "tepo/seq_clipfrac") == 0.0, step
        assert metric(data, "ppo_kl") == 0.0, step
    # and the policy still learned: a non-zero gradient on every step whose groups' rewards differ
    for record in records:
        assert_step_updated(record["data"], record["step"])
    assert any(metric(r["data"], "grad_norm") > 0 for r in records)
