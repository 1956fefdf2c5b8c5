"""Float64 golden tests: tepo_verl.core against the loop-based reference (tests/tepo_reference.py).

Loss, gradient w.r.t. the current log-probs and every metric, over random shapes, lengths (0 and 1 included),
masks and every option combination.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from batches import random_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from tepo_reference import reference_tepo

from tepo_verl.core import TepoOptions, tepo_policy_loss
from tepo_verl.core.options import CHOICES

OPTION_GRID = [
    TepoOptions(ratio_mode=r, mask_rule=m, mask_action=a, kl_target=k, kl_estimator=e, kl_coef=c)
    for r, m, a, k, e, c in itertools.product(
        CHOICES["ratio_mode"], CHOICES["mask_rule"], CHOICES["mask_action"], CHOICES["kl_target"],
        ("k1", "abs", "k2", "k3"), (0.7,),
    )
]
#: The control variants (our own): every rule with either advantage factor, and the top fraction of each scored rule.
CONTROL_GRID = [
    TepoOptions(mask_rule=m, mask_advantage=adv, mask_top_frac=f, mask_action=a, kl_coef=0.7)
    for m, adv, f, a in itertools.product(CHOICES["mask_rule"], CHOICES["mask_advantage"], (1.0, 0.2, 0.5),
                                          CHOICES["mask_action"])
    if f == 1.0 or m in ("surprisal_old", "surprisal", "old")
]


def _run_both(batch, opts, lo=0.2, hi=0.28, use_weights=False):
    kwargs = dict(
        entropy=batch.entropy, old_entropy=batch.old_entropy, ref_log_prob=batch.ref_log_prob,
    )
    weights = batch.is_weights if use_weights else None
    out = tepo_policy_loss(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask,
        clip_ratio_low=lo, clip_ratio_high=hi, options=opts, rollout_is_weights=weights, **kwargs,
    )
    (grad,) = torch.autograd.grad(out.loss, batch.log_prob, allow_unused=True)
    ref_loss, ref_metrics = reference_tepo(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, lo=lo, hi=hi, opts=opts,
        is_weights=weights, **kwargs,
    )
    ref_grad = torch.autograd.grad(ref_loss, batch.log_prob, allow_unused=True)[0] if ref_loss.requires_grad else None
    return out, grad, ref_loss, ref_grad, ref_metrics


def _assert_same(out, grad, ref_loss, ref_grad, ref_metrics):
    assert out.loss.dtype == torch.float64
    torch.testing.assert_close(out.loss, ref_loss.to(out.loss.dtype), rtol=1e-12, atol=1e-12)
    grad = torch.zeros_like(out.token_loss) if grad is None else grad
    ref_grad = torch.zeros_like(grad) if ref_grad is None else ref_grad
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)
    assert set(out.metrics) == set(ref_metrics)
    for name, value in ref_metrics.items():
        assert out.metrics[name] == pytest.approx(value, rel=1e-10, abs=1e-12), name


@pytest.mark.parametrize("opts", OPTION_GRID,
                         ids=lambda o: f"{o.ratio_mode}-{o.mask_rule}-{o.mask_action}-{o.kl_target}-{o.kl_estimator}")
def test_every_option_combination_matches_reference(opts):
    batch = random_batch(seed=7, batch_size=6, max_len=9, drift=0.4)
    _assert_same(*_run_both(batch, opts))


@pytest.mark.parametrize("opts", CONTROL_GRID, ids=lambda o: f"{o.mask_rule}-{o.mask_advantage}-top{o.mask_top_frac}-"
                                                            f"{o.mask_action}")
def test_every_control_variant_matches_reference(opts):
    batch = random_batch(seed=9, batch_size=7, max_len=9, drift=0.4)
    _assert_same(*_run_both(batch, opts))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch_size=st.integers(1, 7),
    max_len=st.integers(1, 12),
    opts=st.sampled_from(OPTION_GRID + CONTROL_GRID),
    clip=st.sampled_from([(0.2, 0.28), (3e-4, 4e-4), (0.0, 0.0)]),
    drift=st.sampled_from([0.0, 1e-4, 0.3, 2.0]),
    use_weights=st.booleans(),
)
def test_random_batches_match_reference(seed, batch_size, max_len, opts, clip, drift, use_weights):
    batch = random_batch(seed=seed, batch_size=batch_size, max_len=max_len, drift=drift)
    _assert_same(*_run_both(batch, opts, lo=clip[0], hi=clip[1], use_weights=use_weights))


def test_reference_and_core_agree_on_the_mask_rule_that_ran():
    batch = random_batch(seed=2, batch_size=5, max_len=6)
    opts = TepoOptions(mask_rule="surprisal", mask_fallback="surprisal_old")
    out = tepo_policy_loss(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, clip_ratio_low=0.2,
        clip_ratio_high=0.2, options=opts, entropy=None, old_entropy=batch.old_entropy,
    )
    assert (out.mask_rule, out.mask_fallback_used) == ("surprisal_old", True)
    ref_loss, ref_metrics = reference_tepo(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, lo=0.2, hi=0.2, opts=opts,
        rule="surprisal_old", old_entropy=batch.old_entropy,
    )
    torch.testing.assert_close(out.loss, ref_loss)
    assert out.metrics["mask_frac"] == pytest.approx(ref_metrics["mask_frac"])
    assert 0 < out.metrics["mask_frac"] < 1


def test_gradcheck_where_straight_through_is_exact():
    """With responses of length <= 1 the sequence ratio IS the token ratio, so the straight-through gradient must
    equal the true (finite-difference) gradient of the loss."""
    batch = random_batch(seed=11, batch_size=6, max_len=3, drift=0.05, lengths=[1, 0, 1, 1, 1, 1])
    for opts in (TepoOptions(kl_estimator="k2"), TepoOptions(ratio_mode="prefix", kl_estimator="k3", kl_target="ref")):

        def f(log_prob, opts=opts):
            return tepo_policy_loss(
                log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, clip_ratio_low=0.2,
                clip_ratio_high=0.28, options=opts, entropy=batch.entropy, old_entropy=batch.old_entropy,
                ref_log_prob=batch.ref_log_prob,
            ).loss

        assert torch.autograd.gradcheck(f, (batch.log_prob,), eps=1e-7, atol=1e-8)


def _closed_form_grad(batch, opts, lo, hi):
    """d loss / d l_it from the formula: (1/N) * [-A_i s_it if unclipped else 0] + (1/N) * beta * M_it * dD/dl."""
    out = tepo_policy_loss(
        batch.log_prob.detach(), batch.old_log_prob, batch.advantages, batch.response_mask, clip_ratio_low=lo,
        clip_ratio_high=hi, options=opts, entropy=batch.entropy, old_entropy=batch.old_entropy,
    )
    valid = batch.response_mask.bool()
    n = valid.sum()
    lengths = batch.response_mask.sum(-1, keepdim=True).clamp(min=1)
    seq_lr = ((batch.log_prob.detach() - batch.old_log_prob) * batch.response_mask).sum(-1, keepdim=True) / lengths
    s = torch.exp(seq_lr).expand_as(batch.log_prob)
    a = batch.advantages
    clipped = (-a * torch.clamp(s, 1 - lo, 1 + hi)) > (-a * s)
    d = batch.log_prob.detach() - batch.old_log_prob
    dkl = {"k1": torch.ones_like(d), "abs": torch.sign(d), "k2": d, "k3": 1 - torch.exp(-d)}[opts.kl_estimator]
    grad = torch.where(clipped, torch.zeros_like(s), -a * s) + opts.kl_coef * (out.mask.to(d.dtype) * dkl)
    return torch.where(valid, grad, torch.zeros_like(grad)) / n


@pytest.mark.parametrize("estimator", ["k1", "abs", "k2", "k3"])
def test_gradient_matches_closed_form(estimator):
    batch = random_batch(seed=0, batch_size=6, max_len=8, drift=0.05)
    opts = TepoOptions(kl_estimator=estimator, kl_coef=0.7)
    out = tepo_policy_loss(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, clip_ratio_low=0.02,
        clip_ratio_high=0.03, options=opts, entropy=batch.entropy, old_entropy=batch.old_entropy,
    )
    (grad,) = torch.autograd.grad(out.loss, batch.log_prob)
    assert out.mask.any() and out.metrics["seq_clipfrac"] > 0  # the test exercises the mask and the clip
    torch.testing.assert_close(grad, _closed_form_grad(batch, opts, 0.02, 0.03), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("estimator", ["k1", "abs", "k2", "k3"])
@pytest.mark.parametrize("ratio_mode", ["sequence", "prefix"])
def test_penalty_grad_share_is_the_penalty_terms_share_of_the_loss_gradient(estimator, ratio_mode):
    """penalty_grad_share = sum_M |d(beta D)/dl| / (sum_M |d(beta D)/dl| + sum_M |d pg/dl|), read here off the real
    loss's autograd: the policy term's gradient is the gradient at beta = 0 (the mask does not depend on beta), the
    penalty's the rest."""
    batch = random_batch(seed=3, batch_size=8, max_len=10, drift=0.3)
    opts = TepoOptions(ratio_mode=ratio_mode, kl_estimator=estimator, kl_coef=0.7)

    def loss_and_grad(options):
        out = tepo_policy_loss(
            batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, clip_ratio_low=0.02,
            clip_ratio_high=0.03, options=options, old_entropy=batch.old_entropy,
            rollout_is_weights=batch.is_weights,
        )
        return out, torch.autograd.grad(out.loss, batch.log_prob)[0]

    out, full = loss_and_grad(opts)
    _, policy_only = loss_and_grad(dataclasses.replace(opts, kl_coef=0.0))
    m = out.mask
    clipped = out.metrics["token_clipfrac"]
    assert m.any() and 0 < clipped < 1  # masked tokens, on both branches
    penalty, policy = (full - policy_only)[m].abs().sum(), policy_only[m].abs().sum()
    assert penalty > 0 and policy > 0
    assert out.metrics["penalty_grad_share"] == pytest.approx(float(penalty / (penalty + policy)), rel=1e-9)
    clipped_masked = (m & (policy_only == 0)).sum() / m.sum()  # a clipped token's policy term has no gradient
    assert out.metrics["masked_clipfrac"] == pytest.approx(float(clipped_masked), rel=1e-12)
    dropped, _ = loss_and_grad(dataclasses.replace(opts, mask_action="drop"))
    assert dropped.metrics["penalty_grad_share"] == 0.0  # drop adds no penalty term


def test_mask_frac_positive_is_the_masked_share_of_positive_advantage_tokens():
    batch = random_batch(seed=4, batch_size=8, max_len=10)
    out = tepo_policy_loss(
        batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask, clip_ratio_low=0.2,
        clip_ratio_high=0.28, old_entropy=batch.old_entropy,
    )
    positive = batch.response_mask.bool() & (batch.advantages > 0)
    surprisal_old = batch.old_log_prob + batch.old_entropy > 0
    expected = int((positive & surprisal_old).sum()) / int(positive.sum())
    assert 0 < expected < 1
    assert out.metrics["mask_frac_positive"] == pytest.approx(expected, rel=1e-12)
    assert out.metrics["mask_frac_positive"] > out.metrics["mask_frac"]  # same numerator, fewer tokens below


def test_penalty_grad_share_is_one_when_only_the_penalty_acts_on_masked_tokens():
    """Every masked response clipped (its policy term has no gradient) while the penalty pulls: the penalty is all
    the gradient there is on the masked tokens, share 1 (finite), and every masked token is clipped.
    Every log-prob rose by 0.1, so the positive-advantage responses (the masked ones) are above 1 + e_high."""
    batch = random_batch(seed=5, batch_size=6, max_len=8)
    log_prob = (batch.old_log_prob + 0.1).requires_grad_(True)
    opts = TepoOptions(mask_rule="always", kl_estimator="k2")
    out = tepo_policy_loss(log_prob, batch.old_log_prob, batch.advantages, batch.response_mask,
                           clip_ratio_low=0.01, clip_ratio_high=0.01, options=opts)
    _, ref_metrics = reference_tepo(log_prob, batch.old_log_prob, batch.advantages, batch.response_mask,
                                    lo=0.01, hi=0.01, opts=opts)
    assert out.mask.any() and out.metrics["token_clipfrac"] == out.metrics["mask_frac"]  # the masked ones
    assert out.metrics["penalty_grad_share"] == ref_metrics["penalty_grad_share"] == 1.0
    assert out.metrics["masked_clipfrac"] == ref_metrics["masked_clipfrac"] == 1.0
