"""End to end: verl 0.9.1's real trainer runs TEPO on CPU (recipes/cpu.sh), checked from verl's own logs.

One run of `python -m verl.trainer.main_ppo` (Ray, FSDP2 actor, vLLM rollout) on the tiny addition task, read back
from the file logger's JSONL and the console, on the pytest run's Ray head, started beforehand as a multi-node job's
cluster is (tests/conftest_e2e.py): the `tepo` preset as shipped, one prompt per PPO mini-batch (OFF_POLICY_MINI):
four updates per step, the last three off-policy. That the penalty changes the update, and that with the mask off
the off-policy update runs without it, is shown bit for bit on verl's actor loss in
tests/test_penalty_changes_update.py (verl 0.9.1's trainer orders each step's rollout requests by random group ids,
so two trainer runs with the same seed do not sample the same responses, and a run with the mask off could not be
compared with this one step for step).

The exact on-policy invariants (one mini-batch per step, where current == old) are checked on the legacy trainer's
preempted and resumed run of tests/test_e2e_legacy.py; here each step's first, on-policy update is held to float32
noise. About 2 minutes on 2 cores. Without the tested CPU stack the tests skip with the
reason; under CI=true they fail instead (conftest_e2e). Marked `e2e`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest_e2e  # noqa: E402
from conftest_e2e import metric, run_recipe  # noqa: E402
from tepo_reference import reference_advantage  # noqa: E402

from tepo_verl.report.compare import run_row  # noqa: E402
from tepo_verl.report.runs import load_run  # noqa: E402

pytestmark = pytest.mark.e2e

STEPS = 3
BATCH, N = 4, 4  # the recipe's defaults: prompts per step, rollouts per prompt
#: Prompts per PPO mini-batch in the off-policy runs: BATCH // OFF_POLICY_MINI = 4 updates per step, 3 of them
#: off-policy. Whether an off-policy response clips depends on the sampled data: its advantage must be non-zero
#: and its ratio must have moved past the clip range the way that advantage pushes it (up for a positive one,
#: down for a negative one). With the recipe's default of two mini-batches (one off-policy update per step) a
#: 3-step run clipped nothing in 1 of the 3 runs checked; with three off-policy updates per step, 14 of 15 steps
#: over 5 runs clipped, and 14 of 15 had a positive masked KL.
OFF_POLICY_MINI = 1
#: The tepo run's folder of verl's rollout dumps: <step>.jsonl, one line per response with its reward (`score`) and
#: its key `uid` = <group uid>_<rollout>_<output> (verl's v1 trainer).
ROLLOUTS = "rollouts"

#: The TEPO loss's metrics for the shipped `tepo` preset (mask rule surprisal_old, on the old policy's stored
#: log-probs and entropy; the current entropy is not computed), as verl logs them from the actor worker.
TEPO_METRICS = [
    "tepo/mask_frac", "tepo/masked_kl_mean", "tepo/seq_ratio_mean", "tepo/seq_ratio_min", "tepo/seq_ratio_max",
    "tepo/seq_clipfrac", "tepo/mask_rule/surprisal_old", "tepo/mask_fallback_used",
]


@pytest.fixture(scope="module", autouse=True)
def cpu_stack():
    conftest_e2e.require_cpu_stack()


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("cpu-runs")


@pytest.fixture(scope="module")
def tepo_run(runs_root):
    run_dir = runs_root / "tepo-seed1"
    # verl also dumps each step's responses with their reward and group (trainer.rollout_data_dir)
    return run_recipe(run_dir, "tepo", STEPS, f"trainer.rollout_data_dir={run_dir / ROLLOUTS}", COMPARE="1",
                      MINI=str(OFF_POLICY_MINI))


# ---- the shipped preset, off-policy mini-batches ------------------------------------------------------------------

def test_every_step_logged(tepo_run):
    steps = [record["step"] for record in tepo_run["logged"]]
    assert steps == list(range(0, STEPS + 1)), steps
    # validation before training and at the last step, as verl's core validation metric
    for record in (tepo_run["logged"][0], tepo_run["logged"][-1]):
        assert any(k.startswith("val-core/") and k.endswith("/acc/mean@1") for k in record["data"]), record


def _rollouts(run: dict, step: int) -> list[dict]:
    path = run["dir"] / ROLLOUTS / f"{step}.jsonl"
    assert path.is_file(), f"verl dumped no rollouts for step {step} at {path}"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_tepo_estimator_ran_in_trainer(tepo_run):
    """The trainer ran TEPO's advantage estimator: the config it ran with selects it (verl looks an estimator up by
    name and raises on an unknown one, and a failed plugin load registers a `tepo` that raises), and on every step
    the advantages verl logged are the group-relative advantages of that step's rewards, as verl dumped them per
    response, computed here by the float64 reference of tests/tepo_reference.py."""
    console, config = tepo_run["console"], tepo_run["config"]
    assert config.algorithm.adv_estimator == "tepo", "trainer config does not select adv_estimator=tepo"
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "tepo"
    assert "tepo-verl failed to load" not in console and "[tepo-verl] ERROR" not in console
    spread = 0
    for record in tepo_run["records"]:
        data, step = record["data"], record["step"]
        assert "timing_s/adv" in data, sorted(data)
        samples = _rollouts(tepo_run, step)
        groups = [sample["uid"].rsplit("_", 2)[0] for sample in samples]
        assert sorted(Counter(groups).values()) == [N] * BATCH, (step, Counter(groups))
        expected = reference_advantage([float(sample["score"]) for sample in samples], groups)
        # every token of a response carries its advantage: verl's max and min over tokens are over responses
        assert data["critic/advantages/max"] == pytest.approx(max(expected), abs=1e-5), (step, expected)
        assert data["critic/advantages/min"] == pytest.approx(min(expected), abs=1e-5), (step, expected)
        assert data["critic/advantages/min"] <= data["critic/advantages/mean"] <= data["critic/advantages/max"]
        spread += max(expected) > 0
    assert spread, "no group had a reward spread on any step: the advantages were all zero"


def test_tepo_loss_ran_in_actor_with_all_metrics_finite(tepo_run):
    for record in tepo_run["records"]:
        data = record["data"]
        missing = [name for name in TEPO_METRICS if metric(data, name) is None]
        assert not missing, f"step {record['step']}: TEPO metrics missing {missing}; logged: {sorted(data)}"
        for name in TEPO_METRICS:
            value = metric(data, name)
            assert isinstance(value, (int, float)) and math.isfinite(value), (record["step"], name, value)
        assert 0.0 <= metric(data, "tepo/mask_frac") <= 1.0


#: How far the first update of a step may see its log-probs move on CPU: float32 rounding only. The old-log-prob pass
#: and the update pack their micro-batches differently here (four responses per update, sixteen per pass), so the
#: two computations of one token's log-prob may differ in their last bits; far below the 3e-4 clip.
ONPOLICY_NOISE = 1e-5


def test_each_steps_first_update_is_on_policy(tepo_run):
    """The v1 trainer hands the first mini-batch of every step the policy that generated it: the first update's
    largest token and sequence log-ratios are float32 noise, while the later, off-policy updates moved the ratio."""
    for record in tepo_run["records"]:
        data, step = record["data"], record["step"]
        for name in ("tepo/onpolicy_token_log_ratio_abs_max", "tepo/onpolicy_seq_log_ratio_abs_max"):
            assert 0.0 <= metric(data, name) < ONPOLICY_NOISE, (step, name, metric(data, name))
    assert any(metric(r["data"], "tepo/token_log_ratio_abs_max") > 100 * ONPOLICY_NOISE for r in tepo_run["records"])


def test_configured_mask_rule_ran_on_the_stored_tensors(tepo_run):
    for record in tepo_run["records"]:
        data = record["data"]
        assert metric(data, "tepo/mask_rule/surprisal_old") == 1.0, record["step"]
        assert metric(data, "tepo/mask_fallback_used") == 0.0, record["step"]
        others = [k for k in data if "tepo/mask_rule/" in k and not k.endswith("/surprisal_old")]
        assert not others, others
        # the preset does not compute the current entropy, so nothing that needs it is logged
        assert metric(data, "tepo/entropy_delta") is None


def test_off_policy_update_moves_the_ratio_and_fires_the_mask(tepo_run):
    """Every mini-batch after a step's first is off-policy: the ratio leaves 1, responses clip, the mask fires and
    the masked KL is positive."""
    records = [r["data"] for r in tepo_run["records"]]
    assert any(metric(d, "tepo/seq_ratio_min") < 1.0 < metric(d, "tepo/seq_ratio_max") for d in records)
    clipped = [metric(d, "tepo/seq_clipfrac") for d in records]
    assert any(fraction > 0 for fraction in clipped), clipped
    assert any(metric(d, "tepo/mask_frac") > 0 and metric(d, "tepo/masked_kl_mean") > 0 for d in records)


def test_the_recipe_hands_the_loss_float32_log_probs(tepo_run):
    """The recipe's default (PRECISION=float32) makes verl's FSDP actor compute in float32, so the loss gets float32
    log-probs and the adapter's dtype check stays silent (with verl's CPU default bf16 forced, the same check speaks:
    tests/test_e2e_legacy.py)."""
    assert "PRECISION=float32" in tepo_run["console"]
    assert not [line for line in tepo_run["console"].splitlines() if conftest_e2e.PRECISION_WARNING in line]


def test_run_metrics_for_the_comparison_and_the_update_memory(tepo_run):
    """What `tepo-verl compare` and benchmarks/step_cost.py read, from the real trainer: the common (token-mean)
    entropy equals verl's own `actor/entropy` under the preset's token-mean aggregation, every step generates
    BATCH x N responses (no dynamic sampling here), and the CPU mode logs the actor's memory during each update."""
    for record in tepo_run["records"]:
        data = record["data"]
        assert metric(data, "tepo_verl/entropy_token_mean") == pytest.approx(data["actor/entropy"], rel=1e-5)
        assert metric(data, "tepo_verl/responses_generated") == BATCH * N
        assert metric(data, "tepo_verl/prompts_generated") == BATCH
        peak, start = metric(data, "perf/cpu_update_peak_rss_gb"), metric(data, "perf/cpu_update_start_rss_gb")
        assert 0 < start <= peak < 64, (record["step"], start, peak)


def test_recipe_ends_with_the_comparison_table(tepo_run):
    console = tepo_run["console"]
    assert "[cpu.sh] comparison of the runs under" in console
    assert re.search(rf"\| tepo +\| +1 +\| +{STEPS} +\|", console), "no comparison-table row for the tepo run"
    assert (tepo_run["dir"].parent / "compare" / "compare.csv").exists()


def test_console_shows_training_progress(tepo_run):
    console = tepo_run["console"]
    # verl's own training bar (tqdm, "Training Progress"), at its end: STEPS of STEPS, not any other bar's count
    assert re.search(rf"Training Progress: 100%\|[^|\n]*\| {STEPS}/{STEPS} ", console), \
        [line[-120:] for line in console.splitlines() if "Training Progress" in line][-3:]
    assert "tepo/mask_frac" in console  # the console logger prints the step metrics too
    assert "target_num_threads" not in console  # the recipe sizes transfer_queue's threads to the machine


def test_evaluation_reads_verls_real_validation_dump(tepo_run):
    """`tepo-verl eval` on the generations verl saved (trainer.validation_data_dir) reproduces verl's own
    validation accuracy: exactly with the saved verdicts, and by regrading with the maths reward."""
    import csv

    from tepo_verl.evaluation.cli import main as evaluate

    dump = tepo_run["dir"] / "val_generations"
    logged = {record["step"]: value for record in tepo_run["logged"] for key, value in record["data"].items()
              if key.startswith("val-core/") and key.endswith("/acc/mean@1")}
    for step, extra in ((STEPS, ["--use-saved"]), (0, [])):
        out = tepo_run["dir"] / f"eval-{step}"
        assert evaluate([str(dump), "--step", str(step), "--data-source", "tepo_tiny_addition", "--out-dir",
                         str(out), "--no-progress", *extra]) == 0
        rows = {row["benchmark"]: row for row in csv.DictReader(open(out / "results.csv"))}
        row = rows["tepo_tiny_addition"]
        assert int(row["problems"]) == 128 and int(row["n"]) == 1
        tolerance = 0 if extra else 2 / 128  # the maths grader may read an odd output differently
        assert abs(float(row["avg@n"]) - logged[step]) <= tolerance + 1e-6, (step, row, logged[step])  # CSV: 6 decimals
        assert float(row["maj@n"]) == float(row["avg@n"])  # one sample per problem: the vote is that sample


# ---- the Ray head started beforehand ---------------------------------------------------------------------------------

def test_the_run_on_the_pre_started_ray_cluster_logs_into_the_run_folder(tepo_run, ray_head):
    """recipes/cpu.sh with RAY_ADDRESS of a head started beforehand (`ray start --head`, as on every multi-node job),
    from an environment without the recipe's variables: the driver connected to it on loopback instead of starting a
    Ray of its own, passed it no resources, and the trainer (a Ray actor) got the recipe's variables through verl's
    runtime env: its file logger wrote into the run folder, and the plugin loaded in the Ray processes."""
    console, run_dir = tepo_run["console"], tepo_run["dir"]
    assert f"Connecting to existing Ray cluster at address: {ray_head.address}" in console, console[-3000:]
    assert "Connected to Ray cluster" in console and "Started a local Ray instance" not in console, console[-3000:]
    assert ray_head.address.startswith("127.0.0.1:") and "Local node IP: 127.0.0.1" in ray_head.started
    assert "num_cpus and num_gpus must not be provided" not in console
    # the file logger wrote into the run folder (run_recipe fails the test when it did not), every step
    assert [r["step"] for r in tepo_run["records"]] == list(range(1, STEPS + 1))
    # and not into the worker's working directory, the logger's default without VERL_FILE_LOGGER_PATH
    assert not list(ray_head.temp_dir.rglob(f"{run_dir.name}.jsonl"))
    # the plugin loaded in the Ray processes on their own (the head never saw the recipe's variables): the actor
    # worker ran TEPO's loss with the preset's mask rule, and the trainer logged the plugin's run metrics
    for record in tepo_run["records"]:
        data = record["data"]
        assert metric(data, "tepo/mask_rule/surprisal_old") == 1.0, (record["step"], sorted(data))
        assert metric(data, "tepo_verl/responses_generated") > 0, record["step"]
    # compare's row of this uninterrupted run: every step and validation once (tests/test_e2e_legacy.py holds a
    # resumed run to the same)
    row = run_row(load_run(run_dir / "metrics.jsonl"), 0.5)
    assert (row["steps"], row["validations"]) == (STEPS, 2)  # validated before training and at the last step
