"""The spec's sanity properties and numerical safety, as property tests on tepo_verl.core."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from tepo_verl.core import TepoOptions, kl_estimate, tepo_policy_loss
from tepo_verl.core.options import CHOICES

seeds = st.integers(0, 2**31 - 1)
shapes = st.tuples(st.integers(1, 6), st.integers(1, 10))


def _loss(batch, opts, lo=0.2, hi=0.28, log_prob=None, **kw):
    kw.setdefault("entropy", batch.entropy)
    kw.setdefault("old_entropy", batch.old_entropy)
    kw.setdefault("ref_log_prob", batch.ref_log_prob)
    return tepo_policy_loss(
        batch.log_prob if log_prob is None else log_prob, batch.old_log_prob, batch.advantages,
        batch.response_mask, clip_ratio_low=lo, clip_ratio_high=hi, options=opts, **kw,
    )


@settings(max_examples=40, deadline=None)
@given(seed=seeds, shape=shapes, ratio_mode=st.sampled_from(CHOICES["ratio_mode"]),
       estimator=st.sampled_from(["k1", "abs", "k2", "k3"]), action=st.sampled_from(CHOICES["mask_action"]))
def test_current_equals_old(seed, shape, ratio_mode, estimator, action):
    """Spec: s = 1, D = 0, the 'old' mask is empty, loss = -mean_token(A), grad_it = -A_i / N."""
    batch = random_batch(seed, *shape, drift=0.0)
    assert torch.equal(batch.log_prob.detach(), batch.old_log_prob)
    opts = TepoOptions(ratio_mode=ratio_mode, mask_rule="old", kl_estimator=estimator, mask_action=action)
    out = _loss(batch, opts, old_entropy=batch.entropy)  # current == old: same entropies too
    valid = batch.response_mask.bool()
    n = max(int(valid.sum()), 1)
    assert not out.mask.any()
    assert out.metrics["seq_ratio_min"] == out.metrics["seq_ratio_max"] == 1.0
    assert out.metrics["masked_kl_mean"] == 0.0 and out.metrics["mask_frac"] == 0.0
    torch.testing.assert_close(kl_estimate(batch.log_prob, batch.old_log_prob, estimator)[valid],
                               torch.zeros(int(valid.sum()), dtype=torch.float64))
    torch.testing.assert_close(out.loss, -(batch.advantages * batch.response_mask).sum() / n)
    (grad,) = torch.autograd.grad(out.loss, batch.log_prob)
    torch.testing.assert_close(grad, -batch.advantages * batch.response_mask / n)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, shape=shapes, drift=st.sampled_from([0.01, 0.3, 3.0]))
def test_clipping_acts_per_sequence(seed, shape, drift):
    """Sequence mode: all valid tokens of one response are clipped (zero policy gradient) or none is."""
    batch = random_batch(seed, *shape, drift=drift)
    out = _loss(batch, TepoOptions(mask_rule="off"), lo=0.05, hi=0.05)
    (grad,) = torch.autograd.grad(out.loss, batch.log_prob)
    for i, n in enumerate(batch.lengths):
        if n == 0 or float(batch.advantages[i, 0]) == 0.0:
            continue
        zero = grad[i, :n] == 0
        assert bool(zero.all()) or not bool(zero.any()), (i, grad[i, :n])


@settings(max_examples=60, deadline=None)
@given(seed=seeds, shape=shapes, rule=st.sampled_from(["old", "surprisal", "surprisal_old"]))
def test_mask_only_selects_positive_advantage_valid_falling_tokens(seed, shape, rule):
    batch = random_batch(seed, *shape)
    out = _loss(batch, TepoOptions(mask_rule=rule))
    assert not (out.mask & (batch.advantages <= 0)).any()
    assert not (out.mask & ~batch.response_mask.bool()).any()
    falling = {
        "old": batch.entropy < (1 - TepoOptions().mask_old_rtol) * batch.old_entropy,
        "surprisal": batch.log_prob.detach() + batch.entropy > 0,
        "surprisal_old": batch.old_log_prob + batch.old_entropy > 0,
    }[rule]
    assert not (out.mask & ~falling).any()
    assert torch.equal(out.mask, falling & (batch.advantages > 0) & batch.response_mask.bool())


def test_the_old_rule_selects_only_tokens_whose_entropy_fell():
    batch = random_batch(4, 6, 8)
    out = _loss(batch, TepoOptions(mask_rule="old"))
    assert out.mask.any()
    assert (batch.entropy[out.mask] < batch.old_entropy[out.mask]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_old_rule_ignores_on_policy_rounding_noise_by_default(dtype):
    """On-policy, H and H_old differ by rounding only (a GPU's two passes pack micro-batches differently; verl's
    fused kernels return the entropy in bf16). Rounding each of them to `dtype` differently, one unit in the last
    place at most, moves no token past the default tolerance; the literal H < H_old (r = 0) picks about half the
    positive-advantage tokens at random."""
    batch = random_batch(12, 16, 64, drift=0.0)
    h = batch.entropy.to(dtype)  # H_old: a value of the dtype
    ulp = torch.finfo(dtype).eps * torch.exp2(torch.floor(torch.log2(h.double().clamp(min=1e-30))))  # spacing at h
    sign = torch.where(torch.rand(h.shape, generator=torch.Generator().manual_seed(0)) < 0.5, -1.0, 1.0)
    h_noisy = h.double() + sign * ulp  # one ulp either way
    positive = batch.response_mask.bool() & (batch.advantages > 0)
    out = _loss(batch, TepoOptions(mask_rule="old"), entropy=h_noisy, old_entropy=h.double())
    assert not out.mask.any()
    literal = _loss(batch, TepoOptions(mask_rule="old", mask_old_rtol=0.0), entropy=h_noisy,
                    old_entropy=h.double())
    assert 0.35 < literal.mask.sum() / positive.sum() < 0.65
    fell = batch.entropy.double() * (1 - 2 * TepoOptions().mask_old_rtol)  # a real fall of twice the tolerance
    assert torch.equal(_loss(batch, TepoOptions(mask_rule="old"), entropy=fell, old_entropy=batch.entropy).mask,
                       positive & (batch.entropy > 0))


@pytest.mark.parametrize("log_ratio", [50.0, -50.0])
@pytest.mark.parametrize("estimator", ["k1", "abs", "k2", "k3"])
@pytest.mark.parametrize("ratio_mode", CHOICES["ratio_mode"])
def test_extreme_log_ratios_stay_finite(log_ratio, estimator, ratio_mode):
    batch = random_batch(1, 5, 7)
    log_prob = (batch.old_log_prob + log_ratio).requires_grad_(True)
    out = _loss(batch, TepoOptions(kl_estimator=estimator, ratio_mode=ratio_mode, mask_rule="surprisal_old"),
                log_prob=log_prob)
    (grad,) = torch.autograd.grad(out.loss, log_prob)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    # every metric finite, even above the clamp, where the policy term has no gradient and the penalty has one
    assert all(torch.isfinite(torch.tensor(v)) for v in out.metrics.values())
    assert 0 <= out.metrics["penalty_grad_share"] <= 1 and 0 <= out.metrics["masked_clipfrac"] <= 1


def test_nan_in_padding_never_leaks():
    batch = random_batch(2, 4, 6, lengths=[6, 2, 0, 3])
    pad = ~batch.response_mask.bool()
    log_prob = torch.where(pad, torch.full_like(batch.old_log_prob, float("nan")), batch.log_prob.detach())
    log_prob.requires_grad_(True)
    old = torch.where(pad, torch.full_like(batch.old_log_prob, float("inf")), batch.old_log_prob)
    out = tepo_policy_loss(log_prob, old, batch.advantages, batch.response_mask, clip_ratio_low=0.2,
                           clip_ratio_high=0.2, options=TepoOptions(mask_rule="surprisal"), entropy=batch.entropy)
    (grad,) = torch.autograd.grad(out.loss, log_prob)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    assert (grad[pad] == 0).all()


def test_all_masked_rows_and_empty_batches_are_safe():
    batch = random_batch(3, 4, 5, lengths=[0, 0, 0, 0])
    out = _loss(batch, TepoOptions())
    (grad,) = torch.autograd.grad(out.loss, batch.log_prob)
    assert out.loss == 0 and (grad == 0).all()
    assert out.metrics["mask_frac"] == 0.0 and out.metrics["seq_ratio_mean"] == 1.0


@pytest.mark.parametrize("rule", ["surprisal", "old", "off"])
def test_bfloat16_inputs(rule):
    batch = random_batch(5, 6, 16, dtype=torch.float64)
    bf = {k: getattr(batch, k).detach().to(torch.bfloat16) for k in
          ("log_prob", "old_log_prob", "advantages", "response_mask", "entropy", "old_entropy")}
    log_prob = bf.pop("log_prob").requires_grad_(True)
    out = tepo_policy_loss(log_prob, bf["old_log_prob"], bf["advantages"], bf["response_mask"],
                           clip_ratio_low=3e-4, clip_ratio_high=4e-4, options=TepoOptions(mask_rule=rule),
                           entropy=bf["entropy"], old_entropy=bf["old_entropy"])
    out.loss.backward()
    assert out.loss.dtype == torch.float32  # computed in float32, not bf16
    assert torch.isfinite(out.loss) and torch.isfinite(log_prob.grad.float()).all()
    assert log_prob.grad.dtype == torch.bfloat16
    ref = tepo_policy_loss(log_prob.detach().double(), bf["old_log_prob"].double(), bf["advantages"].double(),
                           bf["response_mask"].double(), clip_ratio_low=3e-4, clip_ratio_high=4e-4,
                           options=TepoOptions(mask_rule=rule), entropy=bf["entropy"].double(),
                           old_entropy=bf["old_entropy"].double())
    torch.testing.assert_close(out.loss.double(), ref.loss, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- options

def test_unknown_option_names_and_values_list_the_valid_ones():
    with pytest.raises(ValueError,
                       match=r"mask_rule='entropy'.*valid values: surprisal_old, surprisal, old, always, off"):
        TepoOptions(mask_rule="entropy")
    with pytest.raises(ValueError, match=r"Unknown TEPO option\(s\) \['beta'\].*valid options: ratio_mode"):
        TepoOptions.from_mapping({"beta": 1.0})
    with pytest.raises(ValueError, match="kl_coef=-1"):
        TepoOptions(kl_coef=-1)
    with pytest.raises(ValueError, match="kl_estimator='k4'"):
        TepoOptions(kl_estimator="k4")


# ------------------------------------------------------------------ the control variants (our own, not the paper's)

@settings(max_examples=40, deadline=None)
@given(seed=seeds, shape=shapes)
def test_control_masks_every_positive_or_every_valid_token(seed, shape):
    batch = random_batch(seed, *shape)
    valid = batch.response_mask.bool()
    always = _loss(batch, TepoOptions(mask_rule="always"))
    assert torch.equal(always.mask, valid & (batch.advantages > 0))
    assert always.metrics["mask_frac_positive"] == (1.0 if (valid & (batch.advantages > 0)).any() else 0.0)
    everywhere = _loss(batch, TepoOptions(mask_rule="always", mask_advantage="any"))
    assert torch.equal(everywhere.mask, valid)
    assert everywhere.metrics["mask_frac"] == (1.0 if valid.any() else 0.0)


@settings(max_examples=60, deadline=None)
@given(seed=seeds, shape=shapes, rule=st.sampled_from(["surprisal_old", "surprisal", "old"]),
       frac=st.sampled_from([0.05, 0.2, 0.5, 0.99]), advantage=st.sampled_from(["positive", "any"]))
def test_top_fraction_keeps_the_largest_entropy_decrease_of_the_rules_mask(seed, shape, rule, frac, advantage):
    """mask_top_frac = f keeps ceil(f n) of the rule's n masked tokens, and no dropped token scores higher than a
    kept one, the score p (l + H) A read on the rule's own tensors (the stored ones for surprisal_old)."""
    batch = random_batch(seed, *shape)
    full = _loss(batch, TepoOptions(mask_rule=rule, mask_advantage=advantage))
    top = _loss(batch, TepoOptions(mask_rule=rule, mask_advantage=advantage, mask_top_frac=frac))
    n = int(full.mask.sum())
    assert not (top.mask & ~full.mask).any()
    assert int(top.mask.sum()) == -(-round(frac * 100) * n // 100)  # ceil(f n), f in hundredths
    l, h = ((batch.old_log_prob, batch.old_entropy) if rule == "surprisal_old"
            else (batch.log_prob.detach(), batch.entropy))
    score = torch.exp(l) * (l + h) * batch.advantages
    dropped = full.mask & ~top.mask
    if top.mask.any() and dropped.any():
        assert score[dropped].max() <= score[top.mask].min()


@pytest.mark.parametrize("values,match", [
    (dict(mask_rule="sometimes"),
     r"mask_rule='sometimes' is not valid; valid values: surprisal_old, surprisal, old, always, off"),
    (dict(mask_advantage="negative"), r"mask_advantage='negative' is not valid; valid values: positive, any"),
    (dict(mask_top_frac=0.0), r"mask_top_frac=0.0 must be a number in \(0, 1\]"),
    (dict(mask_old_rtol=1.0), r"mask_old_rtol=1.0 must be a number in \[0, 1\)"),
    (dict(mask_old_rtol=-0.1), r"mask_old_rtol=-0.1 must be a number in \[0, 1\)"),
    (dict(mask_top_frac=1.5), r"mask_top_frac=1.5 must be a number in \(0, 1\]"),
    (dict(mask_top_frac=0.2, mask_rule="always"), r"mask_rule=always does not read; valid mask rules with it: "
                                                  r"surprisal_old, surprisal, old"),
])
def test_bad_control_values_are_one_line_errors_naming_the_valid_ones(values, match):
    with pytest.raises(ValueError, match=match) as error:
        TepoOptions.from_mapping(values)
    assert "\n" not in str(error.value)
