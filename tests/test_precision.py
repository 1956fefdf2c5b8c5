"""The log-probs' precision against the clip range: what bf16 does to a GSPO-scale clip, and the adapter's warning.

On CPU verl's FSDP actor returns bf16 log-probs (no flash-attn cross-entropy), and verl's built-in losses compute the
ratio in that dtype. These tests pin down why that matters (verl's GSPO and TEPO with the mask off, identical in
float32, then clip different tokens, while TEPO loses only the rounding of its input) and that the ppo_loss adapter
says so, once per process, for any loss mode.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from batches import random_batch
from conftest_e2e import PRECISION_WARNING
from engine_batch import micro_batches, mini_batch, model_output
from verl.utils.metric import Metric
from verl.workers.utils import losses
from verl_config import actor_config, compose_config

from tepo_verl.verl_adapter import actor_loss
from tepo_verl.verl_adapter.precision import FLOAT32_OVERRIDES, precision_warning, ratio_resolution

GSPO_CLIP = ["actor_rollout_ref.actor.clip_ratio_low=0.0003", "actor_rollout_ref.actor.clip_ratio_high=0.0004",
             "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"]


def test_resolution_is_the_spacing_below_one():
    assert ratio_resolution(torch.bfloat16) == 2.0 ** -8
    assert ratio_resolution(torch.float16) == 2.0 ** -11
    assert ratio_resolution(torch.float32) == 2.0 ** -24
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        step = ratio_resolution(dtype)
        below_one = torch.tensor(1.0 - step, dtype=dtype)
        assert below_one < 1 and torch.tensor(1.0 - step / 4, dtype=dtype) == 1  # nothing in between


@pytest.mark.parametrize(("dtype", "low", "high", "warns"), [
    (torch.bfloat16, 3e-4, 4e-4, True),
    (torch.bfloat16, 0.2, 0.28, False),
    (torch.bfloat16, 3e-3, 4e-3, True),  # 3e-3 < 3.9e-3
    (torch.float16, 3e-4, 4e-4, True),  # 4.9e-4
    (torch.float16, 3e-3, 4e-3, False),
    (torch.float32, 3e-4, 4e-4, False),
    (torch.float64, 1e-6, 1e-6, False),
])
def test_the_warning_names_the_dtype_the_clip_range_and_the_fix(dtype, low, high, warns):
    message = precision_warning(dtype, low, high, "gspo")
    if not warns:
        assert message is None
        return
    assert message.startswith(f"{PRECISION_WARNING} {dtype}")
    assert f"{low:g}/{high:g} of loss_mode=gspo" in message and f"{ratio_resolution(dtype):.1e}" in message
    assert "flash-attn" in message and all(override in message for override in FLOAT32_OVERRIDES)
    assert "\n" not in message


def test_the_float32_overrides_set_verls_mixed_precision():
    config = compose_config(["+algorithm=tepo", *FLOAT32_OVERRIDES])
    for role in ("actor", "ref"):
        assert dict(config.actor_rollout_ref[role].fsdp_config.mixed_precision) == {
            "param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def _loss(config, batch, dtype):
    """verl's ppo_loss (through the adapter) on one micro-batch whose log-probs arrive in `dtype`."""
    log_prob = batch.log_prob.detach().to(dtype).requires_grad_(True)
    old = batch.old_log_prob.to(dtype)
    cast = dataclasses.replace(batch, old_log_prob=old)
    (mb,) = micro_batches(mini_batch(cast, [2] * batch.response_mask.shape[0]))
    loss, metrics = losses.ppo_loss(config, model_output(log_prob, None, mb), mb)
    loss.backward()
    clipfrac = metrics["actor/pg_clipfrac"]
    return loss.detach().double(), log_prob.grad.double(), clipfrac.aggregate() if isinstance(clipfrac, Metric) \
        else clipfrac


def test_bf16_log_probs_make_gspo_and_tepo_nomask_clip_differently(monkeypatch):
    """Identical on float32 log-probs; on bf16 ones verl's GSPO clips on bf16 ratios and TEPO on upcast ones:
    TEPO's bf16 result is exactly its float32 result on the bf16-rounded log-probs."""
    monkeypatch.setattr(actor_loss, "_PRECISION_CHECKED", True)
    tepo = actor_config(["+algorithm=tepo_nomask", *GSPO_CLIP])
    gspo = actor_config(["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", *GSPO_CLIP])
    batch = random_batch(3, 16, 12, drift=0.003, lengths=[12] * 16)  # ratios within a few 1e-3 of 1
    t32, g32 = _loss(tepo, batch, torch.float32), _loss(gspo, batch, torch.float32)
    torch.testing.assert_close(t32[0], g32[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(t32[1], g32[1], rtol=1e-5, atol=1e-7)
    assert t32[2] == pytest.approx(g32[2])
    t16, g16 = _loss(tepo, batch, torch.bfloat16), _loss(gspo, batch, torch.bfloat16)
    assert t16[2] != pytest.approx(g16[2])  # different tokens clip
    assert not torch.allclose(t16[1], g16[1], rtol=1e-2, atol=1e-4)  # and the gradients differ
    # TEPO upcasts before any arithmetic: its bf16 result is the float32 loss on the bf16-rounded log-probs (the
    # gradient then rounded back to the log-probs' bf16), so all it loses is the rounding of its input
    rounded = dataclasses.replace(batch, log_prob=batch.log_prob.detach().to(torch.bfloat16).float(),
                                  old_log_prob=batch.old_log_prob.to(torch.bfloat16).float())
    r32 = _loss(tepo, rounded, torch.float32)
    assert torch.equal(t16[0], r32[0])
    assert torch.equal(t16[1], r32[1].to(torch.bfloat16).double())
    assert t16[2] == r32[2]
    assert not torch.equal(r32[0], t32[0])  # the rounding itself did change the loss: the case is not trivial


def test_the_adapter_warns_once_per_process_for_any_loss_mode(monkeypatch, capsys):
    batch = random_batch(5, 8, 9, drift=0.01)
    for mode, dtype, expected in (("gspo", torch.bfloat16, 1), ("tepo", torch.bfloat16, 1), ("gspo", torch.float32, 0)):
        monkeypatch.setattr(actor_loss, "_PRECISION_CHECKED", False)
        config = actor_config([f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}", *GSPO_CLIP])
        for _ in range(2):
            _loss(config, batch, dtype)
            batch.log_prob.grad = None
        err = capsys.readouterr().err
        assert err.count(PRECISION_WARNING) == expected, (mode, dtype, err)
        if expected:
            assert f"loss_mode={mode}" in err
