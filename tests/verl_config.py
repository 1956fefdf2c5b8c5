"""Compose verl's real Hydra config (with the tepo-verl presets) and build its real actor dataclass."""

from __future__ import annotations

import verl  # noqa: F401  (loads the tepo-verl plugin, as in every verl process)
from hydra import compose, initialize_config_module
from verl.utils.config import omega_conf_to_dataclass

BASE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]


def compose_config(overrides=()):
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*BASE, *overrides])


def actor_config(overrides=()):
    """verl's FSDPActorConfig, exactly as engine_workers builds it (omega_conf_to_dataclass of the actor node)."""
    return omega_conf_to_dataclass(compose_config(overrides).actor_rollout_ref.actor)
