"""Compose verl's real Hydra config (with the tepo-verl presets) and build its real actor dataclass, in this process."""

from __future__ import annotations

import copy

import verl  # noqa: F401  (loads the tepo-verl plugin, as in every verl process)
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig
from verl.utils.config import omega_conf_to_dataclass

from tepo_verl.verl_adapter.cli import normalize_algorithm_override

BASE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]

#: (Hydra's config sources, overrides) -> the composition; handed out as copies (tests/test_yaml_memo.py)
_COMPOSED: dict[tuple, DictConfig] = {}


def compose_config(overrides=()):
    """verl's ppo_trainer config with BASE and `overrides`, composed by Hydra as main_ppo does.

    The suite asks for the same composition many times (a preset alone, say, in a dozen tests): each distinct one
    is composed once per test process, keyed by its overrides and the config sources Hydra searches (verl's config
    module, tepo-verl's presets, as registered at the call), and every call gets its own deep copy, so no change a
    test makes to its config reaches another. A test that needs other config files gives Hydra another source."""
    overrides = [*BASE, *overrides]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        sources = GlobalHydra.instance().config_loader().get_sources()
        key = (tuple((source.provider, source.path) for source in sources), tuple(overrides))
        if key not in _COMPOSED:
            _COMPOSED[key] = compose(config_name="ppo_trainer", overrides=overrides)
        return copy.deepcopy(_COMPOSED[key])


def actor_config(overrides=()):
    """verl's FSDPActorConfig, exactly as engine_workers builds it (omega_conf_to_dataclass of the actor node)."""
    return actor_of(compose_config(overrides))


def actor_of(config):
    """The actor dataclass of a config composed already (verl validates it as it builds it)."""
    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def command_line_config(args, config_name="ppo_trainer"):
    """The config `python -m verl.trainer.main_ppo [--config-name NAME] ARGS --cfg job` prints, composed here: the
    plugin's rewrite of `algorithm=NAME` in a verl command's arguments, then Hydra on verl's config module, as
    main_ppo's `@hydra.main` does (tests/test_presets_and_checks.py runs the real command and compares)."""
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name=config_name, overrides=normalize_algorithm_override(list(args)))
