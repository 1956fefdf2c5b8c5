"""TEPO reads the current entropy as a value: with entropy_coeff=0 the adapter hands verl's ppo_loss (and TEPO) a
detached copy, so the update is unchanged and nothing backpropagates through the full-vocabulary entropy."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch
from engine_batch import mini_batch, model_output
from verl.workers.utils import losses
from verl_config import actor_config

from tepo_verl.verl_adapter import actor_loss

PROMPT_LENS = [3, 2, 5, 1, 4, 2]


def update(config, batch, *, detach: bool):
    """One micro-batch through the adapted ppo_loss and its backward; the entropy is a function of a leaf, as the
    engine's entropy is a function of the logits."""
    log_prob = batch.log_prob.detach().clone().requires_grad_(True)
    entropy_leaf = batch.entropy.detach().clone().requires_grad_(True)
    data = mini_batch(batch, PROMPT_LENS)
    out = model_output(log_prob, entropy_leaf * 1.0, data)
    previous, actor_loss.DETACH_ENTROPY = actor_loss.DETACH_ENTROPY, detach
    try:
        loss, metrics = losses.ppo_loss(config, out, data)
    finally:
        actor_loss.DETACH_ENTROPY = previous
    loss.backward()
    return loss.detach(), log_prob.grad, entropy_leaf.grad, out, metrics


@pytest.mark.parametrize("rule", ["surprisal", "old"])
def test_entropy_is_detached_and_the_update_unchanged(rule):
    config = actor_config(["+algorithm=tepo", f"actor_rollout_ref.actor.policy_loss.tepo.mask_rule={rule}",
                           "actor_rollout_ref.actor.calculate_entropy=True",
                           "actor_rollout_ref.actor.clip_ratio_low=0.01",
                           "actor_rollout_ref.actor.clip_ratio_high=0.02"])
    assert config.entropy_coeff == 0
    batch = random_batch(31, 6, 8, drift=0.1)
    loss_before, grad_before, entropy_grad_before, _, metrics_before = update(config, batch, detach=False)
    loss_after, grad_after, entropy_grad_after, out, metrics_after = update(config, batch, detach=True)
    # before: verl backpropagated zeros through the entropy; after: the entropy has no grad path at all
    assert entropy_grad_before is not None and torch.equal(entropy_grad_before, torch.zeros_like(batch.entropy))
    assert entropy_grad_after is None and out["entropy"].grad_fn is None
    assert torch.equal(loss_after, loss_before) and torch.equal(grad_after, grad_before)
    assert grad_after.abs().sum() > 0
    assert metrics_after["tepo/mask_frac"].aggregate() == metrics_before["tepo/mask_frac"].aggregate() > 0
    assert (metrics_after["actor/entropy_loss"].aggregate()
            == pytest.approx(metrics_before["actor/entropy_loss"].aggregate(), rel=1e-15))


def test_an_entropy_bonus_keeps_its_gradient():
    config = actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=surprisal",
                           "actor_rollout_ref.actor.calculate_entropy=True",
                           "actor_rollout_ref.actor.entropy_coeff=0.01"])
    _, _, entropy_grad, out, _ = update(config, random_batch(32, 6, 8), detach=True)
    assert entropy_grad is not None and entropy_grad.abs().sum() > 0 and out["entropy"].grad_fn is not None


def test_other_loss_modes_keep_verls_entropy_graph():
    config = actor_config(["actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                           "actor_rollout_ref.actor.calculate_entropy=True"])
    _, _, entropy_grad, out, _ = update(config, random_batch(33, 6, 8), detach=True)
    assert entropy_grad is not None and out["entropy"].grad_fn is not None  # verl's own behaviour, untouched
