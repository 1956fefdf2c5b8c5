"""End to end: the baselines of the comparison, GRPO and DAPO, run through verl's real trainer on CPU
(recipes/cpu.sh with `ALGO=grpo` and `dapo`), checked from verl's own logs. The results page and `tepo-lab demo`
depend on them.

- GRPO keeps a reference model for its KL loss; on CPU the reference worker runs with FSDP2's CPU offload
  (the CPU mode's fix), and the KL loss against it must be logged, finite, on every step.
- DAPO's dynamic sampling (verl's v1 replay buffer) evicts the groups whose rewards are all equal and
  regenerates them. On the tiny task the warmed-up policy is right about a quarter of the time, so with 4
  samples per prompt about a third of the groups are all wrong: every step has had evictions in our runs, and
  the test needs only one in its 2 steps. It is the one end-to-end run on a Ray of its own (RAY_ADDRESS unset, as
  `tepo-lab demo` and a single machine run the recipe); the others share the pytest run's Ray head.

The other presets that only select one of verl's own losses (gmpo's `geo_mean`, kl_cov's `kl_cov`, ...) get no
trainer run: each composes in verl's config with its keys (tests/test_presets_and_checks.py) and runs its loss
through the plugin's `ppo_loss` on engine-shaped batches (tests/test_baseline_presets.py,
tests/test_verl_integration.py).

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

STEPS = 2
BATCH, N = 4, 4
EVICTED = "training/filter_groups/evicted_samples"


@pytest.fixture(scope="module", autouse=True)
def cpu_stack():
    conftest_e2e.require_cpu_stack()


def _run(tmp_path_factory, algo: str, **env) -> dict:
    return run_recipe(tmp_path_factory.mktemp(algo) / f"{algo}-seed1", algo, STEPS, **env)


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    return _run(tmp_path_factory, "grpo")


@pytest.fixture(scope="module")
def dapo_run(tmp_path_factory):
    return _run(tmp_path_factory, "dapo", own_ray=True)


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
    assert conftest_e2e.PRECISION_WARNING not in console
    # the reference stays at the start while the actor moves: the KL to it is positive after the first update
    assert any(r["data"]["actor/kl_loss"] > 0 for r in grpo_run["records"][1:])


def test_dapo_dynamic_sampling_regenerates_all_equal_groups(dapo_run):
    # on a Ray of its own, which the recipe sized for the trainer (no RAY_ADDRESS)
    assert "Started a local Ray instance" in dapo_run["console"], dapo_run["console"][-3000:]
    assert "Connecting to existing Ray cluster" not in dapo_run["console"]
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
