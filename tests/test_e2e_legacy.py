"""End to end: TEPO on verl 0.9.1's legacy trainer (`trainer.use_v1=False`: main_ppo_v0's TaskRunner and
`RayPPOTrainer`) on CPU, with the default mask rule (`surprisal_old`, which reads the old policy's stored entropy),
preempted and resumed, with verl's CPU default bf16 actor forced: one run, two start-ups.

- Preempted and resumed: the run saves a checkpoint at step 2 of 4 and is killed with everything it started, as a
  preemption does, then runs again into the same folder and resumes to step 4. Its metrics (two segments) hold
  steps 1-4 once each, and compare's row has the steps and validations of an uninterrupted run.
- The legacy trainer's old entropy: it computes the old entropy, logs it as `actor/entropy` and drops it; the plugin
  keeps the same tensor in the batch (tepo_verl/verl_adapter/legacy_trainer.py) and the loss reads it there.
- bf16: the recipe's `PRECISION=bf16` gives the actor verl's CPU default (bf16) instead of the recipe's float32, and
  the adapter's dtype check, in the actor's worker process, says once that bf16 log-probs cannot resolve the
  3e-4/4e-4 clip range.
- On-policy: one mini-batch per step (current == old policy) with the current entropy computed, so that the update
  can be checked against what the old-log-prob pass stored: the algorithm's invariants hold exactly on every step of
  both segments, in bf16. Exactly is a CPU property: here the old-log-prob pass and the update compute
  bit-identical log-probs and entropies (the same micro-batches through the same kernels). On a GPU they do not
  (bf16 lm-head, different micro-batch packings, non-deterministic kernels); the tolerance a GPU run must meet is
  in the docstring of test_on_policy_invariants_hold_exactly.

Why this run is not compared with a v1 run step for step: two trainer runs with the same seed do not sample the same
responses (tests/test_e2e_cpu.py says why for the v1 trainer; the legacy trainer submits its requests through its own
agent-loop manager), so their first batches, and with them the loss and every batch-dependent `tepo/` metric,
differ. On one and the same batch the two trainers' layouts give the loss the same numbers
(tests/test_legacy_trainer.py).

Both parts run on the pytest run's Ray head (tests/conftest_e2e.py), and each holds $TEPO_TRAIN_LOCK. About 5
minutes on 2 cores with nothing else running (293 s measured, with the Ray head's start). Marked `e2e`.
"""

from __future__ import annotations

import json
import math
import os
import re
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
#: Both parts: the legacy trainer, a checkpoint every 2 steps, one mini-batch per step with the current entropy.
OVERRIDES = ("trainer.use_v1=False", "trainer.save_freq=2", "actor_rollout_ref.actor.calculate_entropy=True")
ENV = {"TEST_FREQ": "2", "MINI": str(BATCH), "PRECISION": "bf16"}
#: What the loss logs on this run: the shipped preset's metrics, and those that need the current entropy.
LOGGED = ["tepo/mask_frac", "tepo/mask_frac_positive", "tepo/masked_kl_mean", "tepo/seq_ratio_mean",
          "tepo/seq_ratio_min", "tepo/seq_ratio_max", "tepo/seq_clipfrac", "tepo/token_log_ratio_abs_max",
          "tepo/onpolicy_token_log_ratio_abs_max", "tepo/onpolicy_seq_log_ratio_abs_max", "tepo/entropy",
          "tepo/entropy_delta", "tepo/surprisal_disagreement", "tepo/mask_rule/surprisal_old",
          "tepo/mask_fallback_used", "pg_loss", "ppo_kl", "grad_norm"]


@pytest.fixture(scope="module", autouse=True)
def cpu_stack():
    conftest_e2e.require_cpu_stack()


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _steps(run) -> tuple[list[int], list[int]]:
    """(training steps, validated steps) of a loaded run."""
    return [s for s, m in run.metrics.items() if TRAINING in m], [s for s, _ in run.val_accuracy()]


def _preempted_run(run_dir: Path) -> None:
    """Start recipes/cpu.sh; once step 2 is logged (after its checkpoint is saved), kill it and everything it started
    at once (SIGKILL), as a preemption does. (Stopped with SIGTERM first, Ray's workers went on training while they
    shut down: one run reached its step-4 checkpoint before it ended.)"""
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
                time.sleep(0.2)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            # Ray's workers carry the run folder in their environment
            stop_processes(processes_mentioning(str(run_dir)), signals=(signal.SIGKILL,))


@pytest.fixture(scope="module")
def legacy_run(tmp_path_factory):
    """The run killed after step 2 and resumed; `records` are the training steps of both segments, in order (a step
    in both: the later segment's, as `tepo-verl compare` reads it)."""
    run_dir = tmp_path_factory.mktemp("legacy") / f"{ALGO}-seed1"
    _preempted_run(run_dir)
    checkpointed = (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip()
    resumed = run_recipe(run_dir, ALGO, STEPS, *OVERRIDES, **ENV)
    metrics = run_dir / "metrics.jsonl"
    parts = [_records(path) for path in segments(metrics)]
    by_step = {r["step"]: r for part in parts for r in part if TRAINING in r["data"]}
    records = [by_step[step] for step in sorted(by_step)]
    return {**resumed, "checkpointed": checkpointed, "segments": segments(metrics), "parts": parts,
            "records": records}


# ------------------------------------------------------------------ the legacy trainer ran TEPO

def test_the_legacy_trainer_ran_tepo_with_the_default_mask_rule(legacy_run):
    config, console = legacy_run["config"], legacy_run["console"]
    assert config.trainer.use_v1 is False
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "tepo"
    assert config.actor_rollout_ref.actor.policy_loss.tepo.mask_rule == "surprisal_old"
    assert config.algorithm.adv_estimator == "tepo"
    assert "tepo-verl failed to load" not in console and "[tepo-verl] ERROR" not in console
    # verl's legacy path ran: main_ppo_v0's TaskRunner built RayPPOTrainer (verl warns that both are deprecated)
    assert "Legacy trainer `main_ppo_v0.py` is deprecated" in console
    assert re.search(r"\(TaskRunner pid=\d+\)\S* .*Class 'verl\.trainer\.ppo\.ray_trainer\.RayPPOTrainer' is "
                     r"deprecated", console), "RayPPOTrainer was not built in the legacy TaskRunner"
    assert "TaskRunnerV1" not in console


def test_the_metrics_land_every_step(legacy_run):
    assert [r["step"] for r in legacy_run["records"]] == list(range(1, STEPS + 1))
    for record in legacy_run["records"]:
        data = record["data"]
        missing = [name for name in LOGGED if metric(data, name) is None]
        assert not missing, f"step {record['step']}: missing {missing}; logged: {sorted(data)}"
        for name in LOGGED:
            assert math.isfinite(metric(data, name)), (record["step"], name, metric(data, name))
        assert metric(data, "tepo/mask_rule/surprisal_old") == 1.0 and metric(data, "tepo/mask_fallback_used") == 0.0
        assert [k for k in data if "tepo/mask_rule/" in k] == ["actor/tepo/mask_rule/surprisal_old"]
        assert_step_updated(data, record["step"])
    # compare's extra columns are the v1 trainer's hooks: the legacy trainer logs none (docs/compare.md)
    assert all(metric(r["data"], "tepo_verl/entropy_token_mean") is None for r in legacy_run["records"])


def test_forced_bf16_reaches_the_actor_and_the_loss_says_so_once(legacy_run):
    """The resumed part's console (its own processes): the recipe passed PRECISION=bf16, and the actor's worker
    warned once that its bf16 log-probs cannot resolve the tepo preset's clip range."""
    console = legacy_run["console"]
    assert "PRECISION=bf16" in console
    lines = [line for line in console.splitlines() if conftest_e2e.PRECISION_WARNING in line]
    assert len(lines) == 1, lines
    assert "in torch.bfloat16," in lines[0] and "0.0003/0.0004 of loss_mode=tepo" in lines[0]


# ------------------------------------------------------------------ preempted and resumed

def test_a_preempted_run_resumes_without_losing_metrics(legacy_run):
    run_dir = legacy_run["dir"]
    assert legacy_run["checkpointed"] == "2"  # the killed run had saved its checkpoint at step 2
    assert "resuming: kept the metrics so far as metrics.segment-1.jsonl" in legacy_run["console"]
    metrics = run_dir / "metrics.jsonl"
    assert legacy_run["segments"] == [run_dir / "metrics.segment-1.jsonl", metrics]
    first, second = legacy_run["parts"]
    assert {r["step"] for r in first if TRAINING in r["data"]} >= {1, 2}  # what the killed run logged
    assert [r["step"] for r in second if TRAINING in r["data"]] == [3, 4]  # resumed after the checkpoint at 2
    joined = load_run(metrics)
    # every step once, in order, and the validations of an uninterrupted run: before training, every 2 steps
    assert _steps(joined) == ([1, 2, 3, 4], [0, 2, 4])
    row = run_row(joined, 0.5)
    assert (row["steps"], row["validations"]) == (4, 3)
    assert load_runs([str(run_dir.parent)])[0].path == metrics  # one run, not one per segment


# ------------------------------------------------------------------ one mini-batch per step: current == old

def test_on_policy_invariants_hold_exactly(legacy_run):
    """With one PPO mini-batch per step the update sees the policy that generated the data (current == old): the
    sequence ratio is exactly 1, no token's log-prob moved, and nothing clips or is penalised (kl_target=old), on the
    steps before the preemption and after the resume alike.

    These equalities are CPU-exact properties: on CPU both passes compute bit-identical numbers. On a GPU the
    on-policy update sees 1 plus numerical noise, and a healthy GPU run must keep that noise well inside the clip
    range: on the on-policy update, |log seq_ratio| <= 3e-5 for every response (seq_ratio_min/max within
    1 +- 3e-5, a tenth of the 3e-4 clip, `tepo-verl doctor`'s threshold), seq_clipfrac 0, ppo_kl within +-3e-5,
    and |entropy_delta| a small fraction of the entropy (<= 1e-3 of it). benchmarks/gpu_check.py measures this
    noise on a GPU."""
    for record in legacy_run["records"]:
        data, step = record["data"], record["step"]
        for name in ("tepo/seq_ratio_mean", "tepo/seq_ratio_min", "tepo/seq_ratio_max"):
            assert metric(data, name) == 1.0, (step, name, metric(data, name))
        for name in ("tepo/token_log_ratio_abs_max", "tepo/onpolicy_token_log_ratio_abs_max",
                     "tepo/onpolicy_seq_log_ratio_abs_max", "tepo/seq_clipfrac", "tepo/masked_kl_mean", "ppo_kl"):
            assert metric(data, name) == 0.0, (step, name, metric(data, name))
    # and the policy still learned: a non-zero gradient on some step
    assert any(metric(r["data"], "grad_norm") > 0 for r in legacy_run["records"])


def test_the_mask_reads_the_stored_old_entropy(legacy_run):
    """What the loss read as the old entropy is what the legacy trainer's old-log-prob pass computed: on-policy the
    current entropy the update computes equals it token for token (entropy change 0, and the `surprisal` mask on the
    current tensors selects exactly the tokens `surprisal_old` selects on the stored ones), and its token-mean is
    the entropy verl logged from that pass (`actor/entropy`, token-mean under the preset's loss_agg_mode). The mask
    selected tokens on some step."""
    assert legacy_run["config"].actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    for record in legacy_run["records"]:
        data, step = record["data"], record["step"]
        assert metric(data, "tepo/entropy_delta") == 0.0, step
        assert metric(data, "tepo/surprisal_disagreement") == 0.0, step
        assert metric(data, "tepo/entropy") > 0.0, step
        assert metric(data, "tepo/entropy") == pytest.approx(data["actor/entropy"], rel=1e-5), step
        assert 0.0 <= metric(data, "tepo/mask_frac") <= 1.0
    assert any(metric(r["data"], "tepo/mask_frac") > 0 for r in legacy_run["records"]), "the mask never selected"
