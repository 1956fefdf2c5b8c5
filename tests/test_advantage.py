"""The `tepo` advantage estimator, as verl's registry hands it out: verl's GRPO advantage, and A = 0 exactly for a
response whose group has no spread of rewards (alone in its group, or every reward equal): docs/algorithm.md.

Float64 goldens against the formula written out in plain Python (tests/tepo_reference.py), Hypothesis properties,
and the comparison with verl's own GRPO estimator that the decision rests on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from tepo_reference import reference_advantage
from verl.trainer.ppo import core_algos

import tepo_verl.verl_adapter.registry  # noqa: F401  (registers `tepo`, as `import verl` does with the plugin)
from tepo_verl.core import without_signal

REWARDS = [0.0, 1.0, 0.5, -1.0, 0.1, 0.3]


def tepo(scores, index, mask=None, norm_by_std=True, dtype=torch.float64):
    """The registered estimator on one outcome reward per response, placed on its last valid token as verl does."""
    scores = torch.as_tensor(scores, dtype=dtype)
    mask = torch.ones(len(index), 4, dtype=dtype) if mask is None else mask.to(dtype)
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(len(index)), 3] = scores
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": norm_by_std})
    advantages, returns = core_algos.get_adv_estimator_fn("tepo")(rewards, mask, np.array(index, dtype=object),
                                                                  config=config)
    assert returns is advantages or torch.equal(returns, advantages)
    return advantages, rewards, mask


def verl_grpo(rewards, mask, index, norm_by_std=True):
    return core_algos.compute_grpo_outcome_advantage(rewards, mask, np.array(index, dtype=object),
                                                     norm_adv_by_std_in_grpo=norm_by_std)[0]


batches = st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from(REWARDS), min_size=n, max_size=n),
    st.lists(st.sampled_from("abcd"), min_size=n, max_size=n),
    st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=n, max_size=n),
))


@settings(max_examples=80, deadline=None)
@given(batch=batches, norm=st.booleans())
def test_the_estimator_matches_the_formula(batch, norm):
    scores, index, valid = batch
    mask = torch.tensor(valid, dtype=torch.float64)
    advantages, _, _ = tepo(scores, index, mask, norm_by_std=norm)
    expected = torch.tensor(reference_advantage(scores, index, norm_by_std=norm), dtype=torch.float64)
    torch.testing.assert_close(advantages, expected.unsqueeze(-1) * mask, rtol=1e-12, atol=1e-12)


@settings(max_examples=80, deadline=None)
@given(batch=batches, norm=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_it_is_verls_grpo_wherever_a_group_has_a_spread_of_rewards(batch, norm, dtype):
    """Bit for bit: the advantages are verl's; only the groups without a spread differ, and there they are 0."""
    scores, index, valid = batch
    advantages, rewards, mask = tepo(scores, index, torch.tensor(valid), norm_by_std=norm, dtype=dtype)
    grpo = verl_grpo(rewards, mask, index, norm_by_std=norm)
    assert advantages.dtype == dtype
    spread = ~without_signal(torch.tensor(scores, dtype=dtype), index)
    assert torch.equal(advantages[spread], grpo[spread])
    assert not advantages[~spread].any()


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 12), groups=st.integers(1, 4), shift=st.floats(-5, 5),
       scale=st.floats(0.1, 10))
def test_the_advantage_is_group_relative(seed, n, groups, shift, scale):
    """Invariant to a shift and a scale of the rewards and to the order of the responses; zero-sum in each group."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (n,), generator=g).double()
    index = [f"q{int(k)}" for k in torch.randint(0, groups, (n,), generator=g)]
    base = tepo(scores, index)[0][:, 0]
    assert torch.isfinite(base).all()
    torch.testing.assert_close(tepo(scores + shift, index)[0][:, 0], base, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(tepo(scores * scale, index)[0][:, 0], base, atol=2e-5, rtol=2e-5)
    perm = torch.randperm(n, generator=g)
    torch.testing.assert_close(tepo(scores[perm], [index[k] for k in perm])[0][:, 0], base[perm])
    for group in set(index):
        rows = [k for k, gid in enumerate(index) if gid == group]
        assert abs(float(base[rows].sum())) < 1e-9


def test_a_group_of_one_response_gets_no_advantage():
    """The decided difference: verl's GRPO scores a lone response by its raw reward (mean 0, std 1: R / (1 + eps),
    a step without a baseline); `tepo` gives it 0, as a group-relative advantage with nothing to be relative to."""
    advantages, rewards, mask = tepo([1.0, 1.0, 0.0, 0.7], ["a", "b", "b", "c"])
    assert advantages[0].eq(0).all() and advantages[3].eq(0).all()
    assert advantages[1, 0] > 0 > advantages[2, 0]
    grpo = verl_grpo(rewards, mask, ["a", "b", "b", "c"])
    torch.testing.assert_close(grpo[[0, 3], 0], torch.tensor([1.0, 0.7], dtype=torch.float64) / (1 + 1e-6))


def test_a_group_of_equal_rewards_gets_exactly_no_advantage():
    """verl's GRPO divides the rounding of the group mean by std + eps = eps: equal rewards of 0.3 in float32 give
    advantages of the order of 1e-2 (measured with verl 0.9.1). `tepo` gives exactly 0."""
    index = ["a"] * 7 + ["b"] * 3
    advantages, rewards, mask = tepo([0.3] * 7 + [1.0, 0.0, 1.0], index, dtype=torch.float32)
    assert advantages[:7].eq(0).all() and advantages[7:].ne(0).all()
    assert verl_grpo(rewards, mask, index)[:7].abs().max() > 1e-3


def test_without_norm_by_std_the_advantage_is_centred_only():
    """algorithm.norm_adv_by_std_in_grpo=False (Dr. GRPO's form) reaches verl's estimator: A = R - mean."""
    advantages = tepo([1.0, 0.0, 0.0, 0.0, 5.0], ["a"] * 4 + ["b"], norm_by_std=False)[0][:, 0]
    torch.testing.assert_close(advantages, torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0], dtype=torch.float64))


def test_without_signal_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"shape mismatch: scores \(3,\), index of length 2"):
        without_signal(torch.zeros(3), ["a", "b"])
