"""The KL penalty changes the update, from the first off-policy update on: two PPO mini-batches of one step, run
through verl's real actor loss (`verl.workers.utils.losses.ppo_loss`, on engine-shaped TensorDicts, as the FSDP
engine calls it) with an optimizer step after each, once with the `tepo` preset and once with the same seed and
the mask off.

The first mini-batch is on-policy (current == old): the penalty is exactly zero there and so is its gradient,
so both runs make the same update, bit for bit. The second mini-batch is off-policy (the first update moved the
policy): the mask fires, the masked KL is positive and the two runs' updates differ by exactly the learning rate
times the gradient of the penalty (from the slow float64 reference of tests/tepo_reference.py), which pulls the
masked tokens back: the penalised update leaves them nearer the old policy.

This is the deterministic counterpart of the end-to-end runs (tests/test_e2e_cpu.py): verl 0.9.1's trainer
orders each step's rollout requests by random group ids, so two trainer runs with the same seed do not sample
the same responses and cannot isolate the mask's effect.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_batch import micro_batches, mini_batch, model_output  # noqa: E402
from tepo_reference import reference_tepo  # noqa: E402
from verl.utils.metric import Metric  # noqa: E402
from verl.workers.utils import losses  # noqa: E402
from verl_config import actor_config  # noqa: E402

import tepo_verl.verl_adapter  # noqa: E402,F401  (registers the tepo loss, as the plugin does in verl's workers)
from tepo_verl.core import TepoOptions  # noqa: E402

B, R, V = 8, 6, 5  # responses, response tokens, vocabulary of the toy policy
MINI = 4  # two mini-batches of 4 responses
LR = 2.0
MASK = "actor_rollout_ref.actor.policy_loss.tepo.mask_rule"


def _value(metric):
    return metric.aggregate() if isinstance(metric, Metric) else metric


def _policy(theta: torch.Tensor, tokens: torch.Tensor):
    """Log-probs of the sampled tokens and the entropy at each position, for a policy with one logit table per
    position shared by every response (so updating on some responses moves the policy for all of them)."""
    logp_all = torch.log_softmax(theta, dim=-1)  # (R, V)
    log_prob = logp_all.expand(tokens.shape[0], R, V).gather(-1, tokens[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1).expand(tokens.shape[0], R)
    return log_prob, entropy


def _one_step(overrides: list[str], seed: int = 0):
    """One training step: rollout data from the start policy, then an SGD step per mini-batch.

    Returns the parameters after each mini-batch, the loss metrics of each mini-batch, and the rollout data."""
    config = actor_config(["+algorithm=tepo", *overrides])
    g = torch.Generator().manual_seed(seed)
    theta = (torch.randn(R, V, generator=g) * 0.5).requires_grad_(True)
    with torch.no_grad():
        probs = torch.softmax(theta, -1)
        tokens = torch.stack([torch.multinomial(probs, 1, generator=g).squeeze(-1) for _ in range(B)])  # (B, R)
        old_log_prob, old_entropy = _policy(theta, tokens)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, -1.0])[:, None].expand(B, R).clone()
    response_mask = torch.ones(B, R, dtype=torch.bool)
    params, metrics = [], []
    for rows in (list(range(MINI)), list(range(MINI, B))):
        sub = SimpleNamespace(response_mask=response_mask[rows], old_log_prob=old_log_prob[rows],
                              advantages=advantages[rows], old_entropy=old_entropy[rows])
        data = mini_batch(sub, [3] * len(rows))
        (mb,) = micro_batches(data)
        log_prob, entropy = _policy(theta, tokens[rows])
        loss, m = losses.ppo_loss(config, model_output(log_prob, entropy, mb), mb)
        theta.grad = None
        loss.backward()
        with torch.no_grad():
            theta -= LR * theta.grad
        params.append(theta.detach().clone())
        metrics.append({k: _value(v) for k, v in m.items()})
    rollout = SimpleNamespace(tokens=tokens, old_log_prob=old_log_prob, old_entropy=old_entropy,
                              advantages=advantages, response_mask=response_mask)
    return params, metrics, rollout


def test_same_seed_without_the_mask_differs_from_the_first_off_policy_update_on():
    (on_1, on_2), (m_on_1, m_on_2), _ = _one_step([])  # the preset: surprisal_old mask, KL penalty
    (off_1, off_2), (m_off_1, m_off_2), _ = _one_step([f"{MASK}=off"])
    # first mini-batch, on-policy: ratio exactly 1, no KL, the same update bit for bit
    assert m_on_1["tepo/seq_ratio_min"] == m_on_1["tepo/seq_ratio_max"] == 1.0
    assert m_on_1["tepo/masked_kl_mean"] == 0.0
    assert m_on_1["tepo/mask_frac"] > 0  # the mask selects tokens, but their KL and its gradient are zero
    assert torch.equal(on_1, off_1)
    # second mini-batch, off-policy: the ratio moved, the mask fired with a positive KL, and the update differs
    assert m_on_2["tepo/seq_ratio_min"] < 1.0 or m_on_2["tepo/seq_ratio_max"] > 1.0
    assert m_on_2["tepo/mask_frac"] > 0 and m_on_2["tepo/masked_kl_mean"] > 0
    assert m_off_2["tepo/mask_frac"] == 0.0 and m_off_2["tepo/masked_kl_mean"] == 0.0
    assert m_on_2["tepo/seq_ratio_mean"] == m_off_2["tepo/seq_ratio_mean"]  # same policy going in
    assert not torch.allclose(on_2, off_2, rtol=0, atol=1e-6), (on_2 - off_2).abs().max()


def test_the_same_settings_reproduce_exactly():
    """The control: without a change of settings, the step is bit-for-bit the same, so the difference above is
    the mask's."""
    (a_1, a_2), _, _ = _one_step([])
    (b_1, b_2), _, _ = _one_step([])
    assert torch.equal(a_1, b_1) and torch.equal(a_2, b_2)


def test_the_penalty_moves_the_update_by_the_reference_penalty_gradient_toward_the_old_policy():
    """The second (off-policy) update with the penalty minus the one without is -LR x the gradient of the penalty
    alone, beta x the mean over tokens of k3(current, old) on the masked tokens, computed by the float64 reference
    at the policy both runs share after the first update; and it pulls the masked tokens back toward the old
    policy."""
    (start, on_2), _, rollout = _one_step([])
    (_, off_2), _, _ = _one_step([f"{MASK}=off"])
    rows = list(range(MINI, B))
    theta = start.double().requires_grad_(True)
    log_prob, _ = _policy(theta, rollout.tokens[rows])
    old, old_entropy = rollout.old_log_prob[rows].double(), rollout.old_entropy[rows].double()
    advantages, valid = rollout.advantages[rows].double(), rollout.response_mask[rows]
    preset = TepoOptions(mask_rule="surprisal_old", mask_action="penalty", kl_target="old",
                         kl_estimator="low_var_kl", kl_coef=1.0, ratio_mode="sequence")
    args = dict(lo=3e-4, hi=4e-4, old_entropy=old_entropy)  # the preset's clip range
    with_penalty, metrics = reference_tepo(log_prob, old, advantages, valid, opts=preset, **args)
    without, _ = reference_tepo(log_prob, old, advantages, valid, opts=dataclasses.replace(preset, mask_rule="off"),
                                **args)
    assert metrics["mask_frac"] > 0 and metrics["masked_kl_mean"] > 0
    (penalty_gradient,) = torch.autograd.grad(with_penalty - without, theta)  # (R, V)
    assert penalty_gradient.abs().max() > 1e-3
    torch.testing.assert_close((off_2 - on_2).double(), LR * penalty_gradient, rtol=1e-4, atol=1e-6)

    # the direction: the masked tokens (positive advantage, old surprisal above the old entropy) end nearer the
    # old policy's log-probs with the penalty than without it
    masked = (advantages > 0) & (old + old_entropy > 0)  # (MINI, R)
    assert masked.any()

    def distance(theta_after):
        after, _ = _policy(theta_after.double(), rollout.tokens[rows])
        return ((after - old)[masked] ** 2).sum()

    assert distance(on_2) < distance(off_2), (distance(on_2), distance(off_2))
