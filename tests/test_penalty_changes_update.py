"""The KL penalty changes the update, from the first off-policy update on: two PPO mini-batches of one step, run
through verl's real actor loss (`verl.workers.utils.losses.ppo_loss`, on engine-shaped TensorDicts, as the FSDP
engine calls it) with an optimizer step after each, once with the `tepo` preset and once with the same seed and
the mask off.

The first mini-batch is on-policy (current == old): the penalty is exactly zero there and so is its gradient,
so both runs make the same update, bit for bit. The second mini-batch is off-policy (the first update moved the
policy): the mask fires, the masked KL is positive and the two runs' updates differ.

This is the deterministic counterpart of the end-to-end runs (tests/test_e2e_cpu.py): verl 0.9.1's trainer
orders each step's rollout requests by random group ids, so two trainer runs with the same seed do not sample
the same responses and cannot isolate the mask's effect.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest.importorskip("verl", reason="runs verl's own actor loss")
from engine_batch import micro_batches, mini_batch, model_output  # noqa: E402
from verl.utils.metric import Metric  # noqa: E402
from verl.workers.utils import losses  # noqa: E402
from verl_config import actor_config  # noqa: E402

import tepo_verl.verl_adapter  # noqa: E402,F401  (registers the tepo loss, as the plugin does in verl's workers)

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

    Returns the parameters after each mini-batch and the loss metrics of each mini-batch."""
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
    return params, metrics


def test_same_seed_without_the_mask_differs_from_the_first_off_policy_update_on():
    (on_1, on_2), (m_on_1, m_on_2) = _one_step([])  # the preset: surprisal_old mask, KL penalty
    (off_1, off_2), (m_off_1, m_off_2) = _one_step([f"{MASK}=off"])
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
    (a_1, a_2), _ = _one_step([])
    (b_1, b_2), _ = _one_step([])
    assert torch.equal(a_1, b_1) and torch.equal(a_2, b_2)
