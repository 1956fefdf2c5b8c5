"""The baseline presets `dr_grpo`, `cispo`, `sapo`, `clip_cov`, `gmpo` and `kl_cov` run verl's own losses (verl's
registered policy losses in verl/trainer/ppo/core_algos.py) through the plugin's `ppo_loss` adapter on
engine-shaped batches, with the actor config verl builds from each composed preset, and log that loss's own
metrics. The first four are checked in float64 against their formulas written out here from the papers and verl's
docs, on what distinguishes each from the other presets. (No preset of these gets a trainer run: what runs in the
trainer is verl's own code; tests/test_verl_integration.py checks that the adapter leaves every such loss mode
bit for bit as verl computes it.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from batches import random_batch
from engine_batch import fresh, run, value
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.workers.utils import losses
from verl_config import actor_config, compose_config

BASELINES = ["dr_grpo", "cispo", "sapo", "clip_cov", "gmpo", "kl_cov"]
#: The loss mode each selects, where it is not the preset's name.
LOSS_MODES = {"dr_grpo": "vanilla", "gmpo": "geo_mean"}
#: Response lengths of the test batches: all non-empty, different, so every aggregation mode gives its own value.
LENGTHS = [9, 2, 3, 1, 7, 4, 2, 5]


def batch_for(seed, *, drift=0.3, adv_scale=1.0):
    batch = random_batch(seed, len(LENGTHS), max(LENGTHS), drift=drift, lengths=LENGTHS)
    batch.advantages = batch.advantages * adv_scale
    return batch


def ratio(batch):
    return torch.exp(batch.log_prob.detach() - batch.old_log_prob)  # (B, T)


def ppo_token_loss(batch, low, high, clip_c=None):
    """PPO's clipped token loss max(-A r, -A clip(r, 1 - low, 1 + high)); with clip_c, dual-clip: for A < 0 at
    most -A clip_c. (B, T), differentiable in batch.log_prob."""
    r = torch.exp(batch.log_prob - batch.old_log_prob)
    a = batch.advantages
    loss = torch.maximum(-a * r, -a * r.clamp(1 - low, 1 + high))
    if clip_c is not None:
        loss = torch.where(a < 0, torch.minimum(loss, -a * clip_c), loss)
    return loss


def assert_finite_with_gradient(loss, batch):
    assert torch.isfinite(loss).all()
    grad = batch.log_prob.grad
    assert grad is not None and torch.isfinite(grad).all() and (grad * batch.response_mask).abs().sum() > 0
    assert (grad * (1 - batch.response_mask)).abs().sum() == 0  # nothing reaches padding


# ------------------------------------------------------------------ every baseline runs through verl's ppo_loss

@pytest.mark.parametrize("name", BASELINES)
def test_each_baseline_preset_runs_its_verl_loss_through_ppo_loss(name):
    config = actor_config([f"+algorithm={name}"])
    assert config.policy_loss.loss_mode == LOSS_MODES.get(name, name)
    batch = batch_for(1)
    loss, (metrics,) = run(losses.ppo_loss, config, batch, ref_log_prob=batch.ref_log_prob)
    assert_finite_with_gradient(loss, batch)
    assert torch.isfinite(torch.as_tensor(value(metrics["actor/pg_loss"]))).all()
    assert ("kl_loss" in metrics) == (name == "cispo")  # of these, only CISPO's example keeps the KL loss
    assert not any(key.startswith("tepo/") for key in metrics)


def test_gmpo_runs_verls_geo_mean_loss_with_its_clip_range():
    """GMPO: verl's geo_mean at the preset's 0.4 range, logging the shares of tokens whose log-ratio left
    [-0.4, 0.4], by the advantage's sign."""
    config = actor_config(["+algorithm=gmpo"])
    assert (config.clip_ratio_low, config.clip_ratio_high) == (0.4, 0.4)
    batch = batch_for(1)  # log-ratios drift by 0.3 (standard deviation): beyond 0.4 on some tokens
    _, (metrics,) = run(losses.ppo_loss, config, batch, ref_log_prob=batch.ref_log_prob)
    for name in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower"):
        assert 0.0 <= value(metrics[name]) <= 1.0, (name, value(metrics[name]))
    assert value(metrics["actor/pg_clipfrac"]) > 0
    assert np.isfinite(value(metrics["actor/ppo_kl"]))


def test_kl_cov_runs_verls_kl_cov_loss_with_its_coefficients():
    """KL-Cov: verl's kl_cov with the preset's ratio and coefficient; it clips nothing, so it logs no clip fraction
    (the vanilla loss would), and its one metric of its own, the mean |log-ratio|, is never negative."""
    config = actor_config(["+algorithm=kl_cov"])
    assert (config.policy_loss.kl_cov_ratio, config.policy_loss.ppo_kl_coef) == (0.002, 1.0)
    batch = batch_for(1)
    _, (metrics,) = run(losses.ppo_loss, config, batch, ref_log_prob=batch.ref_log_prob)
    assert not any(key.endswith(("pg_clipfrac", "pg_clipfrac_lower")) for key in metrics), sorted(metrics)
    assert value(metrics["actor/ppo_kl"]) > 0  # the batch's policies differ: a positive mean |log-ratio|


# ------------------------------------------------------------------ Dr. GRPO

def test_dr_grpo_sums_each_responses_tokens_over_a_constant():
    """seq-mean-token-sum-norm: sum over every valid token / (responses x max_response_length), PPO's clip 0.2 and
    verl's dual clip 3.0 per token, no KL term."""
    config = actor_config(["+algorithm=dr_grpo"])
    horizon = compose_config(["+algorithm=dr_grpo"]).data.max_response_length
    assert config.loss_scale_factor == horizon and horizon > max(LENGTHS)
    batch = batch_for(2)
    loss, (metrics,) = run(losses.ppo_loss, config, batch, ref_log_prob=batch.ref_log_prob)
    expected = (ppo_token_loss(batch, 0.2, 0.2, clip_c=3.0) * batch.response_mask).sum() / (len(LENGTHS) * horizon)
    (expected_grad,) = torch.autograd.grad(expected, batch.log_prob)
    torch.testing.assert_close(loss.sum(), expected, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(batch.log_prob.grad, expected_grad, rtol=1e-10, atol=1e-15)
    assert "kl_loss" not in metrics


@pytest.mark.parametrize("n_micro", [2, 4])
def test_dr_grpos_constant_makes_the_gradient_independent_of_the_micro_batch_split(n_micro):
    """verl's default loss_scale_factor (null) divides by the padded response width the loss sees: with the v1
    trainer's unpadded rows, each micro-batch's longest response, so the gradient changes with the split. The
    preset's constant (data.max_response_length) gives one gradient for every split and layout."""
    batch = batch_for(3)
    preset = actor_config(["+algorithm=dr_grpo"])
    run(losses.ppo_loss, preset, fresh(batch))
    whole = batch.log_prob.grad.clone()
    for jagged in (False, True):
        run(losses.ppo_loss, preset, fresh(batch), n_micro=n_micro, jagged=jagged)
        torch.testing.assert_close(batch.log_prob.grad, whole, rtol=1e-12, atol=1e-15)
    verl_default = actor_config(["+algorithm=dr_grpo", "actor_rollout_ref.actor.loss_scale_factor=null"])
    run(losses.ppo_loss, verl_default, fresh(batch), jagged=True)
    whole = batch.log_prob.grad.clone()
    run(losses.ppo_loss, verl_default, fresh(batch), n_micro=n_micro, jagged=True)
    assert not torch.allclose(batch.log_prob.grad, whole, rtol=1e-6, atol=0)


def test_dr_grpo_centres_the_advantage_without_dividing_by_the_std():
    """Through verl's compute_advantage with the preset's algorithm node, called as verl's v1 trainer calls it."""
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])  # groups a (mean 1/4) and b (mean 3/4)
    uids = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
    mask = torch.ones(8, 3)
    mask[[1, 4, 6], 2] = 0
    rewards = torch.zeros(8, 3)
    rewards[torch.arange(8), mask.sum(-1).long() - 1] = scores

    def advantages(preset):
        algo = compose_config([f"+algorithm={preset}"]).algorithm
        data = DataProto.from_dict(tensors={"token_level_rewards": rewards.clone(), "response_mask": mask},
                                   non_tensors={"uid": uids})
        out = compute_advantage(data, adv_estimator=algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                                norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, config=algo)
        return out.batch["advantages"]

    centred = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25])
    torch.testing.assert_close(advantages("dr_grpo"), centred.unsqueeze(-1) * mask)
    # GRPO divides by each group's (unbiased) std, 0.5 in both groups here: twice Dr. GRPO's advantage.
    torch.testing.assert_close(advantages("grpo"), 2 * centred.unsqueeze(-1) * mask, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ CISPO

def test_cispo_keeps_a_gradient_on_tokens_whose_ratio_is_clipped():
    """CISPO's token loss is -sg(clip(r, 1 - 10, 1 + 0.2)) A log pi: the clipped weight has no gradient, the
    log-prob keeps it; PPO's clip (the `grpo` preset) gives such a token no gradient. Plus KL to the reference as
    a loss, low_var_kl with coefficient 0.001; token-mean over the mini-batch's tokens."""
    config = actor_config(["+algorithm=cispo"])
    batch = batch_for(13)
    loss, (metrics,) = run(losses.ppo_loss, config, batch, ref_log_prob=batch.ref_log_prob)
    mask, adv, n_tokens = batch.response_mask, batch.advantages, batch.response_mask.sum()
    weight = ratio(batch).clamp(1 - 10.0, 1 + 0.2)  # (B, T), no gradient
    kl = batch.ref_log_prob - batch.log_prob
    low_var_kl = torch.exp(kl) - kl - 1
    expected = ((-weight * adv * batch.log_prob + 0.001 * low_var_kl) * mask).sum() / n_tokens
    (expected_grad,) = torch.autograd.grad(expected, batch.log_prob)
    torch.testing.assert_close(loss.sum(), expected, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(batch.log_prob.grad, expected_grad, rtol=1e-10, atol=1e-15)
    assert value(metrics["kl_coef"]) == 0.001

    clipped = (ratio(batch) > 1.2) & (adv > 0) & (mask > 0)  # PPO's upper clip is active here
    low = (ratio(batch) < 0.8) & (adv < 0) & (mask > 0)  # PPO clips here too; CISPO's lower bound (-9) does not
    assert clipped.sum() >= 2 and low.sum() >= 2
    pg_grad = batch.log_prob.grad - 0.001 * (1 - torch.exp(kl.detach())) * mask / n_tokens  # policy term alone
    torch.testing.assert_close(pg_grad[clipped], (-1.2 * adv / n_tokens)[clipped], rtol=1e-10, atol=1e-15)
    torch.testing.assert_close(pg_grad[low], (-ratio(batch) * adv / n_tokens)[low], rtol=1e-10, atol=1e-15)
    assert value(metrics["actor/pg_clipfrac"]) == pytest.approx(((ratio(batch) > 1.2) & (mask > 0)).sum().item()
                                                               / n_tokens.item())
    run(losses.ppo_loss, actor_config(["+algorithm=grpo"]), fresh(batch), ref_log_prob=batch.log_prob.detach())
    assert (batch.log_prob.grad[clipped | low] == 0).all()


# ------------------------------------------------------------------ SAPO

def test_sapo_gates_each_token_softly_instead_of_clipping():
    """SAPO's token loss is -(4 / tau) sigmoid(tau (r - 1)) A, tau_pos 1.0 for A > 0 and tau_neg 1.05 otherwise,
    averaged per response and then over responses whatever loss_agg_mode says (the preset's is token-mean)."""
    config = actor_config(["+algorithm=sapo"])
    assert config.loss_agg_mode == "token-mean" and (config.tau_pos, config.tau_neg) == (1.0, 1.05)
    batch = batch_for(5)
    with torch.no_grad():
        batch.log_prob[2, 0] = batch.old_log_prob[2, 0]  # one token on the old policy (r = 1) ...
    assert batch.advantages[2, 0] != 0  # ... with an advantage
    loss, _ = run(losses.ppo_loss, config, batch)
    mask, adv = batch.response_mask, batch.advantages
    tau = torch.where(adv > 0, 1.0, 1.05).to(adv.dtype)
    gate = (4 / tau) * torch.sigmoid(tau * (torch.exp(batch.log_prob - batch.old_log_prob) - 1))
    per_response = (-gate * adv * mask).sum(-1) / mask.sum(-1)  # (B,)
    expected = per_response.sum() / len(LENGTHS)
    (expected_grad,) = torch.autograd.grad(expected, batch.log_prob)
    # verl divides each response's token sum by its length + 1e-8: each response's term is off by 1e-8 at most.
    torch.testing.assert_close(loss.sum(), expected, rtol=0, atol=1e-8 * per_response.abs().sum().item())
    torch.testing.assert_close(batch.log_prob.grad, expected_grad, rtol=2e-8, atol=1e-15)
    token_mean = (-gate.detach() * adv * mask).sum() / mask.sum()
    assert not torch.isclose(loss.sum(), token_mean)  # the batch tells the preset's token-mean from what ran

    # The gate's weight on the policy gradient, d loss / d log pi = -A w / (length x responses):
    # w = 4 sigmoid(tau (r - 1)) (1 - sigmoid(tau (r - 1))) r, exactly 1 (the plain policy gradient) at r = 1 ...
    scale = -adv / (mask.sum(-1, keepdim=True) * len(LENGTHS))
    w = batch.log_prob.grad / torch.where(mask > 0, scale, torch.ones_like(scale))
    assert w[2, 0].item() == pytest.approx(1.0, rel=2e-8)
    # ... and between 0 and r elsewhere: where PPO's clip 0.2 would cut the gradient to 0, the gate only shrinks it.
    r = ratio(batch)
    outside = (adv > 0) & (r > 1.2) & (mask > 0)
    assert outside.sum() >= 2
    assert ((w[outside] > 0) & (w[outside] < r[outside])).all()
    s = torch.sigmoid(r[outside] - 1)
    torch.testing.assert_close(w[outside], 4 * s * (1 - s) * r[outside], rtol=2e-8, atol=0)


def test_sapos_temperatures_are_the_actors_keys():
    """verl's `sapo` reads actor.tau_pos / tau_neg (a changed tau_neg changes the loss); verl's SAPO example spells
    them policy_loss.tau_pos / tau_neg, which verl 0.9.1 cannot build an actor config from."""
    batch = batch_for(5)
    loss, _ = run(losses.ppo_loss, actor_config(["+algorithm=sapo"]), batch)
    other, _ = run(losses.ppo_loss, actor_config(["+algorithm=sapo", "actor_rollout_ref.actor.tau_neg=2.0"]),
                   fresh(batch))
    assert not torch.isclose(loss.sum(), other.sum())
    with pytest.raises(Exception, match="unexpected keyword argument 'tau_pos'"):
        actor_config(["+algorithm=sapo", "+actor_rollout_ref.actor.policy_loss.tau_pos=1.0"])


# ------------------------------------------------------------------ Clip-Cov

def covariance_candidates(batch, low, high, lb=1.0, ub=5.0):
    """Tokens Clip-Cov may detach: valid, not clipped by PPO, with (A - mean A)(log pi - mean log pi) in (lb, ub),
    the means over the micro-batch's valid tokens."""
    mask = batch.response_mask > 0
    lp, adv = batch.log_prob.detach(), batch.advantages
    cov = (adv - adv[mask].mean()) * (lp - lp[mask].mean())
    r = ratio(batch)
    clipped_by_ppo = -adv * r.clamp(1 - low, 1 + high) > -adv * r
    return mask & ~clipped_by_ppo & (cov > lb) & (cov < ub)


def test_clip_cov_detaches_one_covariance_selected_token_per_micro_batch():
    """The preset's clip_cov_ratio 0.0002 of a few dozen tokens is one token (at least one, verl's rule): picked at
    random among the candidates; every other token keeps PPO's clipped gradient with the ratio clamped to [0, 2]."""
    config = actor_config(["+algorithm=clip_cov"])
    batch = batch_for(6, adv_scale=2.0)
    candidates = covariance_candidates(batch, 1.0, 1.0)
    n_tokens = batch.response_mask.sum()
    assert 2 <= candidates.sum() < n_tokens
    ppo = (ppo_token_loss(batch, 1.0, 1.0) * batch.response_mask).sum() / n_tokens
    (ppo_grad,) = torch.autograd.grad(ppo, batch.log_prob)
    assert (ppo_grad[candidates] != 0).all()  # so a detached candidate shows in the gradient
    torch.manual_seed(0)
    loss, (metrics,) = run(losses.ppo_loss, config, batch)
    assert_finite_with_gradient(loss, batch)
    changed = ~torch.isclose(batch.log_prob.grad, ppo_grad, rtol=1e-10, atol=1e-15)
    assert changed.sum() == 1 and candidates[changed].all()
    assert (batch.log_prob.grad[changed] == 0).all()
    assert value(metrics["actor/pg_clipfrac"]) == pytest.approx(1 / n_tokens.item())


def test_clip_cov_with_a_large_ratio_detaches_exactly_the_covariance_window():
    """With clip_cov_ratio 1 every candidate is picked, so the selection is the covariance rule itself."""
    config = actor_config(["+algorithm=clip_cov", "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=1.0"])
    batch = batch_for(6, adv_scale=2.0)
    candidates = covariance_candidates(batch, 1.0, 1.0)
    keep = batch.response_mask * (~candidates).to(batch.response_mask.dtype)
    expected = (ppo_token_loss(batch, 1.0, 1.0) * keep).sum() / batch.response_mask.sum()
    (expected_grad,) = torch.autograd.grad(expected, batch.log_prob)
    loss, _ = run(losses.ppo_loss, config, batch)
    torch.testing.assert_close(loss.sum(), expected, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(batch.log_prob.grad, expected_grad, rtol=1e-10, atol=1e-15)
    assert (batch.log_prob.grad[candidates] == 0).all()
    # A window that holds no token detaches nothing: plain PPO with the clamp [0, 2].
    config = actor_config(["+algorithm=clip_cov", "actor_rollout_ref.actor.policy_loss.clip_cov_lb=1000.0",
                           "actor_rollout_ref.actor.policy_loss.clip_cov_ub=2000.0"])
    ppo = (ppo_token_loss(batch, 1.0, 1.0) * batch.response_mask).sum() / batch.response_mask.sum()
    loss, _ = run(losses.ppo_loss, config, fresh(batch))
    torch.testing.assert_close(loss.sum(), ppo.detach(), rtol=1e-12, atol=1e-15)
