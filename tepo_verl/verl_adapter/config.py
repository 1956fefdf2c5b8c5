"""TEPO options inside verl's typed config.

verl turns `actor_rollout_ref.actor` into dataclasses whose fields are fixed (unknown keys are rejected).
verl builds `actor.policy_loss` from its `_target_` (hydra.utils.instantiate), so the TEPO presets point that
`_target_` at `TepoPolicyLossConfig`, a subclass of verl's `PolicyLossConfig` with one more field, `tepo`,
holding `TepoOptions`. Every TEPO option is then an ordinary key:
`actor_rollout_ref.actor.policy_loss.tepo.kl_coef=0.5`. Without the preset (a bare `policy_loss.loss_mode=tepo`)
the loss uses the `TepoOptions` defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verl.workers.config.actor import PolicyLossConfig

from tepo_verl.core.options import TepoOptions

TEPO_LOSS_MODE = "tepo"
TEPO_ADV_ESTIMATOR = "tepo"


@dataclasses.dataclass
class TepoPolicyLossConfig(PolicyLossConfig):
    """verl's PolicyLossConfig plus `tepo` (all TEPO loss options, validated on construction)."""

    tepo: TepoOptions = dataclasses.field(default_factory=TepoOptions)

    def __post_init__(self) -> None:
        parent_post_init = getattr(super(), "__post_init__", None)
        if parent_post_init is not None:
            parent_post_init()
        # BaseConfig freezes assigned fields, so convert the Hydra dict with object.__setattr__.
        object.__setattr__(self, "tepo", TepoOptions.from_mapping(_plain(self.tepo)))


def _plain(values: Any) -> Any:
    if values is None or isinstance(values, TepoOptions):
        return values
    if isinstance(values, Mapping):
        return dict(values.items())
    raise ValueError(f"policy_loss.tepo must be a mapping of TEPO options, got {values!r}")


def tepo_options(actor_config: Any) -> TepoOptions:
    """The TEPO options of an actor config (verl ActorConfig, or a DictConfig/dict of the actor section)."""
    policy_loss = actor_config.get("policy_loss", None) if hasattr(actor_config, "get") else None
    if policy_loss is None:
        return TepoOptions()
    values = policy_loss.get("tepo", None)
    return TepoOptions.from_mapping(_plain(values))


def loss_mode(actor_config: Any) -> str:
    policy_loss = actor_config.get("policy_loss", None)
    return "vanilla" if policy_loss is None else policy_loss.get("loss_mode", "vanilla")


def clip_ratios(actor_config: Any) -> tuple[float, float]:
    """(clip_ratio_low, clip_ratio_high) of an actor config, each falling back to clip_ratio as verl's losses do."""
    clip_ratio = actor_config.get("clip_ratio", 0.2)
    low = actor_config.get("clip_ratio_low", None)
    high = actor_config.get("clip_ratio_high", None)
    return (clip_ratio if low is None else low), (clip_ratio if high is None else high)
