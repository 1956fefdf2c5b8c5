"""TEPO on verl's legacy trainer (tepo_verl/verl_adapter/legacy_trainer.py), in process, with verl's own code.

The trainer methods that run here are verl 0.9.1's (`RayPPOTrainer._compute_old_log_prob`, `_update_actor`, its
padding helpers and DataProto); what lives in other processes on a cluster is stood in for: the actor worker group
(its old-log-prob pass writes the engine's nested log-prob and entropy output; its update runs verl's `ppo_loss` on
the micro-batches verl's `prepare_micro_batches` makes, as the FSDP engine does). The same batch is also handed to
the loss the way the v1 trainer hands it (one jagged row per response, `engine_batch.jagged_rows`): the loss and every
`tepo/` metric must come out the same on both. The end-to-end run is tests/test_e2e_legacy.py.
"""

from __future__ import annotations

import pytest
import torch
from batches import random_batch
from engine_batch import jagged_rows, model_output
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import tensordict_utils as tu
from verl.utils.config import validate_config
from verl.utils.metric import Metric
from verl.workers.engine.utils import prepare_micro_batches
from verl.workers.utils import losses
from verl_config import compose_config

from tepo_verl.import_hooks import is_replaced, stock
from tepo_verl.verl_adapter import contract, legacy_trainer
from tepo_verl.verl_adapter.checks import check_tepo_config

LEGACY = ["+algorithm=tepo", "trainer.use_v1=False"]
VALID = ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2"]
PROMPT_LENS = [3, 1, 2, 4, 2]


def trainer_batch(batch, prompt_lens) -> DataProto:
    """The legacy trainer's batch after the rollout: prompts left-padded, responses right-padded (verl's layout)."""
    B, R = batch.response_mask.shape
    P = max(prompt_lens)
    prompt_mask = torch.zeros(B, P, dtype=torch.int64)
    for i, p in enumerate(prompt_lens):
        prompt_mask[i, P - p:] = 1
    response_mask = batch.response_mask.to(torch.int64)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 100, (B, P), generator=g) * prompt_mask
    responses = torch.randint(3, 100, (B, R), generator=g) * response_mask
    return DataProto.from_single_dict({
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask, "advantages": batch.advantages.detach().float()},
        meta_info={"temperature": 1.0})


class ActorWorkerGroupStandIn:
    """verl's actor worker group, in process: the old-log-prob pass writes `batch`'s old log-probs and entropies
    as the engine's nested output over prompt + response tokens; the update runs verl's ppo_loss on the micro-batches
    verl's prepare_micro_batches makes of what the trainer sent."""

    def __init__(self, batch, actor_config):
        self.batch, self.actor_config = batch, actor_config
        self.update_losses: list[torch.Tensor] = []
        self.update_metrics: list[dict] = []
        self.sent: TensorDict | None = None

    def compute_log_prob(self, data: TensorDict) -> TensorDict:
        assert tu.get(data, "calculate_entropy") is True
        out = model_output(self.batch.old_log_prob.float(), self.batch.old_entropy.float(), data)
        return tu.get_tensordict({"log_probs": out["log_probs"], "entropy": out["entropy"]},
                                 non_tensor_dict={"metrics": {"mfu": 0.0}})

    def update_actor(self, data: TensorDict) -> TensorDict:
        self.sent = data
        tokens = int(data["response_mask"].sum())
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=tokens, global_batch_size=len(data),
                             use_dynamic_bsz=False, micro_batch_size_per_gpu=len(data))
        micro, _ = prepare_micro_batches(data)
        for mb in micro:
            loss, metrics = losses.ppo_loss(self.actor_config, update_output(self.batch, mb), mb)
            self.update_losses.append(loss.detach())
            self.update_metrics.append(metrics)
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {"mfu": 0.0}})


def update_output(batch, data):
    """The update pass's model output: the current log-probs and entropies of `batch`'s rows."""
    return model_output(batch.log_prob.detach().float(), batch.entropy.float(), data)


def legacy_trainer_for(overrides):
    config = compose_config([*VALID, *overrides])
    validate_config(config, use_reference_policy=False, use_critic=False)  # as main_ppo_v0's TaskRunner does
    trainer = object.__new__(RayPPOTrainer)
    trainer.config = config
    return trainer


def actor(config):
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def test_keep_old_entropy_gives_the_legacy_entropy_the_stored_name_without_a_copy():
    old = DataProto.from_single_dict({"old_log_probs": -torch.rand(2, 3), "entropys": torch.rand(2, 3)})
    assert legacy_trainer.keep_old_entropy(old) is old
    assert old.batch["entropy"].data_ptr() == old.batch["entropys"].data_ptr()
    already = DataProto.from_single_dict({"entropys": torch.rand(2, 3), "entropy": torch.zeros(2, 3)})
    assert torch.equal(legacy_trainer.keep_old_entropy(already).batch["entropy"], torch.zeros(2, 3))  # left alone


@pytest.mark.parametrize("overrides,selects", [
    (LEGACY, True), (["+algorithm=tepo"], False), (["+algorithm=grpo", "trainer.use_v1=False"], False),
    (["+algorithm=tepo_nomask", "trainer.use_v1=False"], True)])
def test_which_configs_run_tepo_on_the_legacy_trainer(overrides, selects):
    assert legacy_trainer.uses_legacy_trainer_with_tepo(compose_config(overrides)) is selects


def test_the_legacy_trainer_with_tepo_passes_the_checks_with_the_default_mask_rule():
    config = compose_config([*VALID, *LEGACY])
    assert config.actor_rollout_ref.actor.policy_loss.tepo.mask_rule == "surprisal_old"
    check_tepo_config(config)
    check_tepo_config(compose_config([*VALID, *LEGACY, "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=old",
                                      "actor_rollout_ref.actor.calculate_entropy=True"]))


def test_validating_a_legacy_tepo_config_wraps_the_legacy_pass_once():
    legacy_trainer_for(LEGACY)
    method = RayPPOTrainer.__dict__["_compute_old_log_prob"]
    assert is_replaced(method) and stock(method).__module__ == "verl.trainer.ppo.ray_trainer"
    legacy_trainer_for(LEGACY)
    assert RayPPOTrainer.__dict__["_compute_old_log_prob"] is not method  # re-wrapped ...
    assert stock(RayPPOTrainer.__dict__["_compute_old_log_prob"]) is stock(method)  # ... around verl's original


def test_the_legacy_pass_keeps_the_entropy_verl_logs_and_a_grpo_run_is_untouched():
    batch = random_batch(5, 5, 6, lengths=[6, 1, 4, 3, 5])
    trainer = legacy_trainer_for(LEGACY)
    trainer.actor_rollout_wg = ActorWorkerGroupStandIn(batch, None)
    old, _ = trainer._compute_old_log_prob(trainer_batch(batch, PROMPT_LENS))
    assert old.batch["entropy"].data_ptr() == old.batch["entropys"].data_ptr()
    mask = batch.response_mask.bool()
    torch.testing.assert_close(old.batch["entropy"][mask], batch.old_entropy.float()[mask], rtol=0, atol=0)
    torch.testing.assert_close(old.batch["old_log_probs"][mask], batch.old_log_prob.float()[mask], rtol=0, atol=0)

    grpo = legacy_trainer_for(["+algorithm=grpo", "trainer.use_v1=False"])
    grpo.actor_rollout_wg = ActorWorkerGroupStandIn(batch, None)
    old, _ = grpo._compute_old_log_prob(trainer_batch(batch, PROMPT_LENS))
    assert sorted(old.batch.keys()) == ["entropys", "old_log_probs"]  # verl's own result


def test_on_the_same_batch_the_loss_and_tepo_metrics_equal_the_v1_trainers():
    """verl's legacy trainer end to end in process: its old-log-prob pass (kept entropy), fit's merge, its update
    (to_tensordict, left_right_2_no_padding) and the worker's micro-batches, into verl's ppo_loss; then the same
    micro-batch laid out as the v1 trainer hands it. The loss and every tepo/ metric are the same numbers."""
    batch = random_batch(11, 5, 6, lengths=[6, 1, 4, 3, 5], drift=0.2)
    trainer = legacy_trainer_for(LEGACY)
    workers = ActorWorkerGroupStandIn(batch, actor(trainer.config))
    trainer.actor_rollout_wg = workers
    data = trainer_batch(batch, PROMPT_LENS)
    old, _ = trainer._compute_old_log_prob(data)
    old.batch.pop("entropys")  # what RayPPOTrainer.fit does with the pass's result after logging actor/entropy
    trainer._update_actor(data.union(old))
    assert "entropy" in workers.sent.keys()
    (legacy_loss,), (legacy_metrics,) = workers.update_losses, workers.update_metrics

    micro, _ = prepare_micro_batches(workers.sent)
    v1 = jagged_rows(micro[0].clone())  # the v1 trainer's layout: one jagged row per response, as TransferQueue has it
    v1_loss, v1_metrics = losses.ppo_loss(actor(trainer.config), update_output(batch, v1), v1)
    torch.testing.assert_close(v1_loss.detach(), legacy_loss, rtol=0, atol=0)
    tepo = sorted(k for k in legacy_metrics if k.startswith("tepo/"))
    assert "tepo/mask_frac" in tepo and sorted(k for k in v1_metrics if k.startswith("tepo/")) == tepo
    for name in tepo:  # a Metric's values: floats, or a RatioMetric's (numerator, denominator) pairs
        values = [m.values if isinstance(m, Metric) else m for m in (legacy_metrics[name], v1_metrics[name])]
        assert values[0] == values[1], name
    assert legacy_metrics["tepo/mask_frac"].aggregate() > 0  # the mask read the stored entropy and selected


# ------------------------------------------------------------------ the legacy trainer's contract, checked for it alone

def test_a_changed_legacy_trainer_refuses_tepo_on_it_alone(monkeypatch):
    """A verl whose legacy trainer no longer returns the old entropy as `entropys` (planted into its source): a config
    running `tepo` on the legacy trainer is refused in validate_config, in one line naming the assumption; the v1
    trainer's `tepo`, and the plugin's load, are not (the assumption's scope is the legacy trainer)."""
    real_text = contract.VerlSource.text

    def text(self, module):
        source = real_text(self, module)
        return source.replace('"entropys": entropy.float()', '"entropies": entropy.float()') \
            if module == contract.LEGACY_TRAINER else source

    monkeypatch.setattr(contract.VerlSource, "text", text)
    assert [a.name for a, _ in contract.broken_assumptions()] == ["legacy old entropy"]
    contract.check_contract(scopes=("load", "compare"))  # what the plugin checks when it loads
    with pytest.raises(contract.VerlContractError) as refused:
        validate_config(compose_config([*VALID, *LEGACY]), use_reference_policy=False, use_critic=False)
    assert str(refused.value).startswith("tepo-verl's verl contract is broken (legacy old entropy): the legacy ")
    assert "\n" not in str(refused.value)
    validate_config(compose_config([*VALID, "+algorithm=tepo"]), use_reference_policy=False, use_critic=False)
