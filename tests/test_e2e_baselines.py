"""End to end: the baselines of the comparison, GRPO, DAPO, GMPO and KL-Cov, run through verl's real trainer on
CPU (recipes/cpu.sh with `ALGO=grpo`, `dapo`, `gmpo`, `kl_cov`), checked from verl's own logs. The results page and
`tepo-lab demo` depend on the first two.

- GRPO keeps a reference model for its KL loss; on CPU the reference worker runs with FSDP2's CPU offload
  (the CPU mode's fix), and the KL loss against it must be logged, finite, on every step.
- DAPO's dynamic sampling (verl's v1 replay buffer) evicts the groups whose rewards are all equal and
  regenerates them. On the tiny task the warmed-up policy is right about a quarter of the time, so with 4
  samples per prompt about a third of the groups are all wrong: every step of the 3 has had evictions in our
  runs, and the test needs only one.

- GMPO (verl's `geo_mean`) and KL-Cov (verl's `kl_cov`) run their own loss in the actor: the trainer's config
  selects it, and each logs that loss's own metrics (KL-Cov: the mean |log-ratio| and no clip fraction, since it
  clips nothing; the `vanilla` loss would log one).

About 2 minutes each on 2 cores. Skips with the reason without the tested CPU stack; fails instead under CI=true.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest_e2e  # noqa: E402
from conftest_e2e import assert_step_updated, run_recipe  # noqa: E402

pytestmark = pytest.mark.e2e

STEPS = 3
BATCH, N = 4, 4
EVICTED = "training/filter_groups/evicted_samples"


@pytest.fixture(scope="module", autouse=True)
def cpu_stack():
    conftest_e2e.require_cpu_stack()


def _run(tmp_path_factory, algo: str) -> dict:
    return run_recipe(tmp_path_factory.mktemp(algo) / f"{algo}-seed1", algo, STEPS)


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    return _run(tmp_path_factory, "grpo")


@pytest.fixture(scope="module")
def dapo_run(tmp_path_factory):
    return _run(tmp_path_factory, "dapo")


@pytest.fixture(scope="module")
def gmpo_run(tmp_path_factory):
    return _run(tmp_path_factory, "gmpo")


@pytest.fixture(scope="module")
def kl_cov_run(tmp_path_factory):
    return _run(tmp_path_factory, "kl_cov")


def _validated(run) -> list[int]:
    return [r["step"] for r in run["logged"] if any(k.startswith("val-core/") for k in r["data"])]


def test_grpo_runs_end_to_end_with_the_reference_model(grpo_run):
    console, config = grpo_run["console"], grpo_run["config"]
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.actor.use_kl_loss is True
    assert [r["step"] for r in grpo_run["logged"]] == list(range(STEPS + 1))
    assert _validated(grpo_run) == [0, STEPS]
    for record in grpo_run["records"]:
        data, step = record["data"], record["step"]
        assert "timing_s/ref" in data, (step, sorted(data))  # the reference model's log-prob pass ran
        kl = data.get("actor/kl_loss")
        assert isinstance(kl, (int, float)) and math.isfinite(kl) and kl >= 0.0, (step, kl)
        assert_step_updated(data, step)
        assert not any("tepo/" in key for key in data), "GRPO ran the TEPO loss"
    # its clip range (0.2) is far above bf16's step near 1 (3.9e-3): no precision warning
    assert "[tepo-verl] WARNING: the actor's log-probs" not in console
    # the reference stays at the start while the actor moves: the KL to it is positive after the first update
    assert any(r["data"]["actor/kl_loss"] > 0 for r in grpo_run["records"][1:])


def test_dapo_dynamic_sampling_regenerates_all_equal_groups(dapo_run):
    # the trainer's config: filter_groups (dynamic sampling) enabled
    assert dapo_run["config"].algorithm.filter_groups.enable is True, "dynamic sampling is not on"
    assert [r["step"] for r in dapo_run["logged"]] == list(range(STEPS + 1))
    assert _validated(dapo_run) == [0, STEPS]
    evicted = {r["step"]: r["data"].get(EVICTED, 0) for r in dapo_run["records"]}
    assert any(count > 0 for count in evicted.values()), f"no group was ever evicted: {evicted}"
    for record in dapo_run["records"]:
        data, step = record["data"], record["step"]
        if data.get(EVICTED):
            # the evicted groups were regenerated: more prompts were sampled than the batch holds
            assert data["tepo_verl/prompts_generated"] > BATCH, (step, data["tepo_verl/prompts_generated"])
        assert_step_updated(data, step)
        # every group that was trained on has a reward spread, so its advantages are not all zero
        assert data["critic/advantages/max"] > 0 > data["critic/advantages/min"], step


def _trained_every_step(run) -> None:
    assert [r["step"] for r in run["logged"]] == list(range(STEPS + 1))
    assert _validated(run) == [0, STEPS]
    for record in run["records"]:
        data, step = record["data"], record["step"]
        assert_step_updated(data, step)
        assert "timing_s/ref" not in data, step  # no KL to a reference: no reference pass
        assert not any("tepo/" in key for key in data), f"step {step} ran the TEPO loss"
    assert any(r["data"]["actor/grad_norm"] > 0 for r in run["records"]), "the policy never got a gradient"
    assert "[tepo-verl] WARNING: the actor's log-probs" not in run["console"]  # clip ranges far above bf16's step


def test_gmpo_runs_verls_geo_mean_loss(gmpo_run):
    actor = gmpo_run["config"].actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == "geo_mean", "the trainer's config does not select geo_mean"
    assert actor.clip_ratio_low == 0.4 and actor.clip_ratio_high == 0.4
    _trained_every_step(gmpo_run)
    for record in gmpo_run["records"]:
        data, step = record["data"], record["step"]
        # geo_mean's metrics: the shares of tokens whose log-ratio left [-0.4, 0.4], by the advantage's sign
        for name in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower"):
            assert 0.0 <= data[name] <= 1.0, (step, name, data.get(name))
        assert math.isfinite(data["actor/ppo_kl"]), step


def test_kl_cov_runs_verls_kl_cov_loss(kl_cov_run):
    policy_loss = kl_cov_run["config"].actor_rollout_ref.actor.policy_loss
    assert policy_loss.loss_mode == "kl_cov", "the trainer's config does not select kl_cov"
    assert policy_loss.kl_cov_ratio == 0.002 and policy_loss.ppo_kl_coef == 1.0
    _trained_every_step(kl_cov_run)
    moved = []
    for record in kl_cov_run["records"]:
        data, step = record["data"], record["step"]
        # kl_cov logs one metric of its own, the mean |log-ratio| (never negative), and no clip fraction: the
        # vanilla loss logs pg_clipfrac and a signed ppo_kl
        assert not any(key.endswith("pg_clipfrac") or key.endswith("pg_clipfrac_lower") for key in data), step
        assert data["actor/ppo_kl"] >= 0.0, (step, data["actor/ppo_kl"])
        moved.append(data["actor/ppo_kl"])
    # the second mini-batch of each step is off-policy, so the policy has moved there
    assert any(value > 0 for value in moved), moved
