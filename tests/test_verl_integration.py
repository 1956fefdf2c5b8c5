"""TEPO inside the real installed verl: registries, the ppo_loss adapter on engine-shaped TensorDicts, verl's
global-batch aggregation, verl's compute_advantage, and the no-op guarantee for every other loss mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from batches import random_batch
from engine_batch import fresh, run, value
from omegaconf import OmegaConf
from tepo_reference import reference_advantage, reference_tepo
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils.metric import AggregationType
from verl.workers.utils import losses
from verl_config import actor_config

from tepo_verl.core import TepoOptions
from tepo_verl.verl_adapter import actor_loss

pytestmark = pytest.mark.verl_090  # also run on verl 0.9.0 (make test-090, docs/testing.md)

TEPO_METRICS = {
    "tepo/mask_frac", "tepo/masked_kl_mean", "tepo/seq_ratio_mean", "tepo/seq_ratio_min", "tepo/seq_ratio_max",
    "tepo/seq_clipfrac", "tepo/entropy", "tepo/entropy_delta", "tepo/surprisal_disagreement",
    "tepo/mask_fallback_used",
}
#: The loss's line when the old entropy did not reach it (registry.STORED_PROVIDER says how it does).
OLD_ENTROPY_MISSING = r"old-policy entropy.*verl's main_ppo: the v1 trainer stores it; on the legacy trainer"


# ------------------------------------------------------------------ registration and binding

def test_plugin_binds_the_adapter_where_verl_binds_ppo_loss():
    from verl.workers import engine_workers

    assert core_algos.get_policy_loss_fn("tepo").__name__ == "compute_policy_loss_tepo"
    assert core_algos.get_adv_estimator_fn("tepo").__name__ == "compute_tepo_outcome_advantage"
    assert losses.ppo_loss is actor_loss.tepo_aware_ppo_loss
    assert engine_workers.ppo_loss is actor_loss.tepo_aware_ppo_loss
    assert actor_loss.stock_ppo_loss() is not actor_loss.tepo_aware_ppo_loss
    assert actor_loss.stock_ppo_loss().__module__ == "verl.workers.utils.losses"


# ------------------------------------------------------------------ TEPO through the adapted ppo_loss

@pytest.mark.parametrize("overrides,agg", [
    ([], "token-mean"),
    (["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"], "seq-mean-token-mean"),
    (["actor_rollout_ref.actor.policy_loss.tepo.ratio_mode=prefix",
      "actor_rollout_ref.actor.policy_loss.tepo.kl_estimator=k2"], "token-mean"),
    (["actor_rollout_ref.actor.policy_loss.tepo.mask_action=drop"], "token-mean"),
])
def test_tepo_through_ppo_loss_matches_the_reference(overrides, agg):
    config = actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.clip_ratio_low=0.01",
                           "actor_rollout_ref.actor.clip_ratio_high=0.02", *overrides])
    batch = random_batch(18, 8, 7, drift=0.1)
    loss, metrics = run(losses.ppo_loss, config, batch)
    opts = config.policy_loss.tepo
    ref_loss, ref_metrics = reference_tepo(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, lo=0.01, hi=0.02, opts=opts,
        entropy=batch.entropy, old_entropy=batch.old_entropy, agg=agg, n_seqs=8,  # verl: global_batch_size
    )
    (ref_grad,) = torch.autograd.grad(ref_loss, batch.log_prob)
    torch.testing.assert_close(loss.sum(), ref_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(batch.log_prob.grad, ref_grad, rtol=1e-10, atol=1e-13)
    (m,) = metrics
    assert TEPO_METRICS <= set(m) and "tepo/mask_rule/surprisal_old" in m
    for name in ("mask_frac", "masked_kl_mean", "seq_ratio_mean", "seq_ratio_min", "seq_ratio_max",
                 "seq_clipfrac", "entropy", "entropy_delta", "surprisal_disagreement"):
        assert value(m[f"tepo/{name}"]) == pytest.approx(ref_metrics[name], rel=1e-10, abs=1e-12), name
    assert value(m["actor/pg_clipfrac"]) == pytest.approx(ref_metrics["token_clipfrac"])
    assert value(m["actor/ppo_kl"]) == pytest.approx(ref_metrics["ppo_kl"])
    assert m["tepo/seq_ratio_min"].aggregation == AggregationType.MIN
    assert m["tepo/seq_ratio_max"].aggregation == AggregationType.MAX
    assert value(m["tepo/mask_rule/surprisal_old"]) == 1.0 and value(m["tepo/mask_fallback_used"]) == 0.0
    assert 0 < value(m["tepo/mask_frac"]) < 1 and value(m["tepo/seq_clipfrac"]) > 0
    assert 0 < value(m["tepo/surprisal_disagreement"]) < 1


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_loss_is_invariant_to_micro_batch_and_data_parallel_splits(agg):
    config = actor_config(["+algorithm=tepo", f"actor_rollout_ref.actor.loss_agg_mode={agg}",
                           "actor_rollout_ref.actor.clip_ratio_low=0.01",
                           "actor_rollout_ref.actor.clip_ratio_high=0.02"])
    batch = random_batch(5, 8, 9, drift=0.05, dtype=torch.float32)
    tokens = int(batch.response_mask.sum())
    grads = []
    for n_micro in (1, 2, 4):
        run(losses.ppo_loss, config, fresh(batch), n_micro=n_micro)
        grads.append(batch.log_prob.grad.clone())
    # Two data-parallel ranks of 4 rows each: verl scales each rank's loss by dp_size and FSDP averages the grads.
    rank_grads = []
    for rows in ([0, 1, 2, 3], [4, 5, 6, 7]):
        run(losses.ppo_loss, config, fresh(batch), rows=rows, n_micro=2, dp_size=2, batch_num_tokens=tokens,
            global_batch_size=8)
        rank_grads.append(batch.log_prob.grad.clone())
    grads.append((rank_grads[0] + rank_grads[1]) / 2)
    assert grads[0].abs().sum() > 0
    for other in grads[1:]:
        torch.testing.assert_close(other, grads[0], rtol=0, atol=1e-6)


def test_missing_current_entropy_names_the_config_key():
    config = actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=surprisal"])
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.calculate_entropy=True"):
        run(losses.ppo_loss, config, random_batch(1, 4, 5), with_entropy=False)


def test_missing_old_entropy_is_an_error_for_the_old_rule():
    config = actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=old"])
    with pytest.raises(ValueError, match=OLD_ENTROPY_MISSING):
        run(losses.ppo_loss, config, random_batch(1, 4, 5), store_old_entropy=False)


def test_explicit_fallback_runs_and_says_so_in_the_metrics():
    config = actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=surprisal",
                           "actor_rollout_ref.actor.policy_loss.tepo.mask_fallback=surprisal_old"])
    batch = random_batch(2, 5, 6)
    loss, (m,) = run(losses.ppo_loss, config, batch, with_entropy=False)
    ref_loss, ref_metrics = reference_tepo(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, lo=3e-4, hi=4e-4,
        opts=config.policy_loss.tepo, rule="surprisal_old", old_entropy=batch.old_entropy)
    torch.testing.assert_close(loss.sum(), ref_loss)
    assert value(m["tepo/mask_rule/surprisal_old"]) == 1.0 and "tepo/mask_rule/surprisal" not in m
    assert value(m["tepo/mask_fallback_used"]) == 1.0
    assert value(m["tepo/mask_frac"]) == pytest.approx(ref_metrics["mask_frac"]) and ref_metrics["mask_frac"] > 0


def test_old_rule_runs_on_the_stored_old_entropy():
    config = actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=old"])
    batch = random_batch(4, 6, 8, drift=0.05)
    _, (m,) = run(losses.ppo_loss, config, batch)
    _, ref_metrics = reference_tepo(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, lo=3e-4, hi=4e-4,
        opts=config.policy_loss.tepo, entropy=batch.entropy, old_entropy=batch.old_entropy)
    assert value(m["tepo/mask_rule/old"]) == 1.0
    assert value(m["tepo/mask_frac"]) == pytest.approx(ref_metrics["mask_frac"]) and ref_metrics["mask_frac"] > 0


def test_kl_target_ref_uses_the_reference_log_probs():
    config = actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.kl_target=ref"])
    batch = random_batch(6, 6, 8)
    loss, (m,) = run(losses.ppo_loss, config, batch, ref_log_prob=batch.ref_log_prob)
    ref_loss, ref_metrics = reference_tepo(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, lo=3e-4, hi=4e-4,
        opts=config.policy_loss.tepo, entropy=batch.entropy, old_entropy=batch.old_entropy,
        ref_log_prob=batch.ref_log_prob)
    torch.testing.assert_close(loss.sum(), ref_loss)
    assert value(m["tepo/masked_kl_mean"]) == pytest.approx(ref_metrics["masked_kl_mean"])
    assert ref_metrics["masked_kl_mean"] > 0
    with pytest.raises(ValueError, match=r"reference log-probs.*use_kl_loss=True"):
        run(losses.ppo_loss, config, fresh(batch))


def test_direct_registry_call_without_the_adapter():
    """verl's get_policy_loss_fn('tepo') works on its own for rules that need no entropy, and says what is
    missing otherwise."""
    batch = random_batch(8, 5, 6)
    fn = core_algos.get_policy_loss_fn("tepo")
    config = actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=off"])
    loss, metrics = fn(batch.old_log_prob, batch.log_prob, batch.advantages, batch.response_mask, "token-mean",
                       config, None)
    ref_loss, _ = reference_tepo(batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask,
                                 lo=3e-4, hi=4e-4, opts=config.policy_loss.tepo)
    torch.testing.assert_close(loss, ref_loss)
    assert metrics["tepo/mask_rule/off"] == 1.0 and "tepo/seq_ratio_min" in metrics
    with pytest.raises(ValueError, match=OLD_ENTROPY_MISSING):
        fn(batch.old_log_prob, batch.log_prob, batch.advantages, batch.response_mask, "token-mean",
           actor_config(["+algorithm=tepo"]), None)
    with pytest.raises(ValueError, match=r"current-policy entropy.*calculate_entropy=True"):
        fn(batch.old_log_prob, batch.log_prob, batch.advantages, batch.response_mask, "token-mean",
           actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=surprisal"]), None)


def test_mask_off_with_seq_mean_token_mean_is_verl_gspo():
    """Spec sanity property: TEPO with the mask off and seq-mean-token-mean is exactly verl's GSPO."""
    clip = ["actor_rollout_ref.actor.clip_ratio_low=0.003", "actor_rollout_ref.actor.clip_ratio_high=0.004",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"]
    tepo = actor_config(["algorithm=tepo_nomask".join(["+", ""]), *clip])
    gspo = actor_config(["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", *clip])
    batch = random_batch(9, 8, 10, drift=0.01)
    tepo_loss, (tm,) = run(losses.ppo_loss, tepo, batch, is_weights=batch.is_weights)
    tepo_grad = batch.log_prob.grad.clone()
    gspo_loss, (gm,) = run(losses.ppo_loss, gspo, fresh(batch), is_weights=batch.is_weights)
    torch.testing.assert_close(tepo_loss, gspo_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(tepo_grad, batch.log_prob.grad, rtol=1e-12, atol=1e-14)
    assert value(tm["actor/pg_clipfrac"]) == pytest.approx(value(gm["actor/pg_clipfrac"]))
    assert value(tm["actor/ppo_kl"]) == pytest.approx(value(gm["actor/ppo_kl"]))
    assert value(tm["tepo/seq_clipfrac"]) > 0


# ------------------------------------------------------------------ other loss modes: the adapter is a no-op

OTHER_MODES = ["vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "dppo_tv", "dppo_kl"]


@pytest.mark.parametrize("mode", OTHER_MODES)
def test_other_loss_modes_are_unchanged_by_the_adapter(mode):
    config = actor_config([f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}",
                           "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.entropy_coeff=0.01"])
    batch = random_batch(13, 8, 9, drift=0.2)
    results = []
    for fn in (actor_loss.stock_ppo_loss(), losses.ppo_loss):
        torch.manual_seed(0)
        np.random.seed(0)
        loss, (m,) = run(fn, config, fresh(batch), ref_log_prob=batch.ref_log_prob, is_weights=batch.is_weights)
        results.append((loss, batch.log_prob.grad.clone(), {k: value(v) for k, v in m.items()}))
    (stock_loss, stock_grad, stock_m), (loss, grad, m) = results
    assert torch.equal(loss, stock_loss) and torch.equal(grad, stock_grad)
    assert m == stock_m and not any(k.startswith("tepo/") for k in m)


# ------------------------------------------------------------------ advantage estimator through verl

def test_compute_advantage_runs_the_tepo_estimator():
    g = torch.Generator().manual_seed(0)
    n = 12
    scores = torch.randint(0, 2, (n,), generator=g).float()
    scores[:4] = 1.0  # one zero-variance group
    uids = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 3 + ["d"], dtype=object)
    mask = (torch.rand(n, 6, generator=g) < 0.8).float()
    mask[:, 0] = 1
    rewards = torch.zeros(n, 6)
    last = mask.cumsum(-1).argmax(-1)
    rewards[torch.arange(n), last] = scores
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uids})
    algo = OmegaConf.create({"adv_estimator": "tepo", "norm_adv_by_std_in_grpo": True, "gamma": 1.0, "lam": 1.0})
    out = compute_advantage(data, adv_estimator="tepo", config=algo)
    expected = torch.tensor(reference_advantage(scores.tolist(), list(uids)), dtype=torch.float32)
    torch.testing.assert_close(out.batch["advantages"], expected.unsqueeze(-1) * mask)
    torch.testing.assert_close(out.batch["returns"], out.batch["advantages"])
    assert (out.batch["advantages"][:4] == 0).all() and (out.batch["advantages"][11] == 0).all()
    # verl's GRPO, bit for bit, wherever a group has a spread of rewards (tests/test_advantage.py has the rest).
    grpo, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uids)
    assert torch.equal(out.batch["advantages"][4:11], grpo[4:11])


def test_options_of_the_preset_reach_the_actor_dataclass():
    config = actor_config(["algorithm=tepo".join(["+", ""]), "actor_rollout_ref.actor.policy_loss.tepo.kl_coef=0.25",
                           "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=old"])
    assert config.policy_loss.tepo == TepoOptions(kl_coef=0.25, mask_rule="old")
    assert config.policy_loss.loss_mode == "tepo" and not config.calculate_entropy  # the preset's default rule


# ------------------------------------------------------------------ the core's KL estimators are verl's

@pytest.mark.parametrize("name", sorted(__import__("tepo_verl.core.kl", fromlist=["KL_ESTIMATORS"]).KL_ESTIMATORS))
def test_kl_estimators_agree_with_verl_kl_penalty(name):
    """Value and gradient of every estimator name against verl's own kl_penalty, clamp edges included."""
    from tepo_verl.core import kl_estimate

    g = torch.Generator().manual_seed(3)
    target = torch.randn(256, dtype=torch.float64, generator=g)
    offsets = torch.cat([torch.tensor([0.0, 20.0, -20.0, 25.0, -25.0, 2.4, -2.4], dtype=torch.float64),
                         torch.randn(249, dtype=torch.float64, generator=g) * 6])
    ours_in = (target + offsets).requires_grad_(True)
    verl_in = (target + offsets).requires_grad_(True)
    ours = kl_estimate(ours_in, target, name)
    theirs = core_algos.kl_penalty(verl_in, target, name)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    (ours_grad,) = torch.autograd.grad(ours.sum(), ours_in)
    (verl_grad,) = torch.autograd.grad(theirs.sum(), verl_in)
    torch.testing.assert_close(ours_grad, verl_grad, rtol=0, atol=0)
    assert (ours.detach() != 0).any()
