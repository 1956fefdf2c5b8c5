"""TEPO on verl's legacy trainer (`trainer.use_v1=False`, `verl.trainer.ppo.ray_trainer.RayPPOTrainer`).

The default mask rule, `surprisal_old`, reads the old policy's entropy. verl's v1 trainer stores it in the batch
(`data["entropy"]`) in its old-log-prob pass. The legacy trainer computes the same entropy in the same pass
(`RayPPOTrainer._compute_old_log_prob` returns it as `entropys`, next to `old_log_probs`), logs it as
`actor/entropy`, pops it and merges the rest into the batch (`RayPPOTrainer.fit`). `keep_old_entropy` gives the
returned DataProto the same tensor once more under the name the v1 trainer stores (`entropy`): fit pops only
`entropys`, so `entropy` goes into the batch with `old_log_probs`, and from there, padded as `old_log_probs` is,
to the actor's update and the loss adapter (actor_loss.py), which reads `data["entropy"]` on either trainer.
Nothing is computed a second time: the two names hold one tensor until fit drops one of them.

`install()` wraps `_compute_old_log_prob` to do that. The plugin calls it from verl's `validate_config` when a
config selects the `tepo` loss on the legacy trainer (plugin.py): main_ppo's driver validates the config, and so
does the legacy trainer's own process (`verl.trainer.main_ppo_v0.TaskRunner.run`) before it builds the trainer.
A process that never validates such a config keeps verl's trainer unchanged, and the wrapper itself passes every
other loss mode's result through untouched.
"""

from __future__ import annotations

from typing import Any

from tepo_verl.import_hooks import replace
from tepo_verl.verl_adapter.config import TEPO_LOSS_MODE

TRAINER_MODULE = "verl.trainer.ppo.ray_trainer"
#: The name the legacy old-log-prob pass returns the entropy under, and the name the v1 trainer stores it under
#: (the one the loss adapter reads).
LEGACY_ENTROPY, STORED_ENTROPY = "entropys", "entropy"


def uses_legacy_trainer_with_tepo(config: Any) -> bool:
    """Whether a verl config runs the `tepo` loss on the legacy trainer (plain lookups: a DictConfig or dict)."""
    trainer = config.get("trainer", None) or {}
    policy_loss = ((config.get("actor_rollout_ref", None) or {}).get("actor", None) or {}).get("policy_loss", None)
    loss_mode = (policy_loss or {}).get("loss_mode", "vanilla")
    return loss_mode == TEPO_LOSS_MODE and not trainer.get("use_v1", True)


def keep_old_entropy(old_log_prob):
    """The legacy old-log-prob pass's DataProto, its entropy also under STORED_ENTROPY (the same tensor, no copy)."""
    batch = old_log_prob.batch
    if LEGACY_ENTROPY in batch.keys() and STORED_ENTROPY not in batch.keys():
        batch[STORED_ENTROPY] = batch[LEGACY_ENTROPY]
    return old_log_prob


def _keeping_old_entropy(stock_compute_old_log_prob):
    def _compute_old_log_prob(self, batch):
        old_log_prob, mfu = stock_compute_old_log_prob(self, batch)
        if uses_legacy_trainer_with_tepo(self.config):
            keep_old_entropy(old_log_prob)
        return old_log_prob, mfu

    _compute_old_log_prob.__doc__ = stock_compute_old_log_prob.__doc__
    return _compute_old_log_prob


def install() -> None:
    """Wrap RayPPOTrainer._compute_old_log_prob with keep_old_entropy (idempotent)."""
    from verl.trainer.ppo import ray_trainer

    replace(ray_trainer.RayPPOTrainer, "_compute_old_log_prob", _keeping_old_entropy)
