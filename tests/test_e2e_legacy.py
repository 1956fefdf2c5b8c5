"""End to end: TEPO on verl 0.9.1's legacy trainer (`trainer.use_v1=False`: main_ppo_v0's TaskRunner and
`RayPPOTrainer`) on CPU, with the default mask rule (`surprisal_old`, which reads the old policy's stored entropy).

One run of recipes/cpu.sh with one PPO mini-batch per step (current == old policy, where the invariants hold exactly
on CPU, as in tests/test_e2e_cpu.py's on-policy run) and the current entropy computed, so that the update can be
checked against what the old-log-prob pass stored: the legacy trainer computes the old entropy, logs it as
`actor/entropy` and drops it; the plugin keeps the same tensor in the batch (tepo_verl/verl_adapter/legacy_trainer.py)
and the loss reads it there.

Why this run is not compared with a v1 run step for step: two trainer runs with the same seed do not sample the same
responses (tests/test_e2e_cpu.py says why for the v1 trainer; the legacy trainer submits its requests through its own
agent-loop manager), so their first batches, and with them the loss and every batch-dependent `tepo/` metric,
differ. On one and the same batch the two trainers' layouts give the loss the same numbers
(tests/test_legacy_trainer.py). About 2 to 5 minutes. Marked `e2e`.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest_e2e  # noqa: E402
from conftest_e2e import assert_step_updated, metric, run_recipe  # noqa: E402

pytestmark = pytest.mark.e2e

STEPS = 3
BATCH, N = 4, 4  # the recipe's defaults
#: What the loss logs on this run: the shipped preset's metrics, and those that need the current entropy.
LOGGED = ["tepo/mask_frac", "tepo/mask_frac_positive", "tepo/masked_kl_mean", "tepo/seq_ratio_mean",
          "tepo/seq_ratio_min", "tepo/seq_ratio_max", "tepo/seq_clipfrac", "tepo/token_log_ratio_abs_max",
          "tepo/onpolicy_token_log_ratio_abs_max", "tepo/onpolicy_seq_log_ratio_abs_max", "tepo/entropy",
          "tepo/entropy_delta", "tepo/surprisal_disagreement", "tepo/mask_rule/surprisal_old",
          "tepo/mask_fallback_used", "pg_loss", "ppo_kl", "grad_norm"]


@pytest.fixture(scope="module", autouse=True)
def cpu_stack():
    conftest_e2e.require_cpu_stack()


@pytest.fixture(scope="module")
def legacy_run(tmp_path_factory):
    return run_recipe(tmp_path_factory.mktemp("legacy") / "tepo-seed1", "tepo", STEPS, "trainer.use_v1=False",
                      "actor_rollout_ref.actor.calculate_entropy=True", MINI=str(BATCH))


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
    assert [record["step"] for record in legacy_run["logged"]] == list(range(0, STEPS + 1))


def test_the_metrics_land_every_step(legacy_run):
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


def test_on_policy_invariants_hold_exactly(legacy_run):
    """One mini-batch per step: the update sees the policy that generated the data, so on CPU the sequence ratio is
    exactly 1, no token's log-prob moved, and nothing clips or is penalised (kl_target=old)."""
    for record in legacy_run["records"]:
        data, step = record["data"], record["step"]
        for name in ("tepo/seq_ratio_mean", "tepo/seq_ratio_min", "tepo/seq_ratio_max"):
            assert metric(data, name) == 1.0, (step, name, metric(data, name))
        for name in ("tepo/token_log_ratio_abs_max", "tepo/onpolicy_token_log_ratio_abs_max",
                     "tepo/onpolicy_seq_log_ratio_abs_max", "tepo/seq_clipfrac", "tepo/masked_kl_mean", "ppo_kl"):
            assert metric(data, name) == 0.0, (step, name, metric(data, name))


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
