"""Rollout rejection sampling (algorithm.rollout_correction.rollout_rs) and TEPO.

verl's v1 trainer applies the rejection by zeroing `response_mask` after the rollout; the engine still takes the
global token count from the rollout's `loss_mask`, and `global_batch_size` still counts rejected responses. The
decision (docs/algorithm.md): TEPO keeps verl's normalisation, exactly as verl's own losses do, so comparisons stay
on equal terms; its metrics count accepted tokens only; the driver says so in one line.
"""

from __future__ import annotations

import pytest
import torch
from batches import random_batch
from engine_batch import mini_batch, model_output
from tepo_reference import reference_tepo
from verl.workers.utils import losses
from verl_config import actor_config, compose_config

from tepo_verl.verl_adapter.checks import check_tepo_config

PROMPT_LENS = [3, 2, 5, 1, 4, 2]
CLIP = ["actor_rollout_ref.actor.clip_ratio_low=0.01", "actor_rollout_ref.actor.clip_ratio_high=0.02"]


def rejected_mask(batch):
    """Response 2 rejected whole (sequence-level mode), tokens 1-2 of response 3 rejected (token-level mode)."""
    mask = batch.response_mask.clone()
    mask[2] = 0
    mask[3, 1:3] = 0
    return mask


def run_with_rejection(config, batch, accepted):
    """One mini-batch as verl's engine sees it after rejection: the accepted response_mask, the loss_mask and
    token count of the rollout."""
    log_prob = batch.log_prob.detach().clone().requires_grad_(True)
    data = mini_batch(batch, PROMPT_LENS, batch_num_tokens=int(batch.response_mask.sum()))
    out = model_output(log_prob, batch.entropy, data)
    data["response_mask"] = accepted.to(torch.int64)  # what the trainer writes back; loss_mask stays the rollout's
    loss, metrics = losses.ppo_loss(config, out, data)
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


def test_tepo_keeps_verls_normalisation_under_rejection():
    batch = random_batch(41, 6, 8, drift=0.1, lengths=[8, 3, 6, 7, 1, 5])
    accepted = rejected_mask(batch)
    config = actor_config(["+algorithm=tepo", *CLIP])
    loss, grad, metrics = run_with_rejection(config, batch, accepted)
    ref_loss, ref_metrics = reference_tepo(batch.log_prob, batch.old_log_prob, batch.advantages, accepted,
                                           lo=0.01, hi=0.02, opts=config.policy_loss.tepo,
                                           old_entropy=batch.old_entropy)
    (ref_grad,) = torch.autograd.grad(ref_loss, batch.log_prob)
    share = accepted.sum() / batch.response_mask.sum()  # the accepted share of the rollout's tokens
    assert 0.5 < share < 1
    torch.testing.assert_close(loss, ref_loss * share, rtol=1e-12, atol=1e-12)  # sum over accepted / all tokens
    torch.testing.assert_close(grad, ref_grad * share, rtol=1e-10, atol=1e-13)
    assert grad[2].abs().sum() == 0 and grad[3, 1:3].abs().sum() == 0  # rejected tokens get no gradient
    # the metrics are over the accepted tokens only; s_i of response 3 is over its accepted tokens
    for name in ("mask_frac", "mask_frac_positive", "seq_ratio_mean", "seq_ratio_min", "seq_ratio_max"):
        assert metrics[f"tepo/{name}"].aggregate() == pytest.approx(ref_metrics[name], rel=1e-10), name


def test_tepo_nomask_equals_verls_gspo_under_rejection():
    """The equal-terms property: with the mask off and GSPO's aggregation TEPO is verl's GSPO, rejection included
    (the rejected response still counts in global_batch_size for both)."""
    batch = random_batch(42, 6, 8, drift=0.1, lengths=[8, 3, 6, 7, 1, 5])
    accepted = rejected_mask(batch)
    agg = "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"
    tepo = actor_config(["+algorithm=tepo_nomask", *CLIP, agg])
    gspo = actor_config(["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", *CLIP, agg])
    tepo_loss, tepo_grad, _ = run_with_rejection(tepo, batch, accepted)
    gspo_loss, gspo_grad, _ = run_with_rejection(gspo, batch, accepted)
    torch.testing.assert_close(tepo_loss, gspo_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tepo_grad, gspo_grad, rtol=1e-10, atol=1e-13)


def test_the_driver_says_so_once_for_tepo_with_rejection(capsys):
    rs = ["algorithm.rollout_correction.rollout_rs=token_k1",
          "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"]
    check_tepo_config(compose_config(["+algorithm=tepo", *rs]))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rollout_rs=token_k1" in err[0] and "accepted share" in err[0]
    check_tepo_config(compose_config(["+algorithm=tepo"]))
    check_tepo_config(compose_config(["+algorithm=gspo", *rs]))
    assert capsys.readouterr().err == ""
