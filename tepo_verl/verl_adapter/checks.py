"""Misconfigurations caught in the driver before any worker starts (hooked into verl's `validate_config`): a strategy
override on a config composed for another engine (any algorithm), and every TEPO misconfiguration."""

from __future__ import annotations

import sys
from typing import Any

from tepo_verl.core.mask import MASK_INPUTS, MASK_RULES, required_inputs
from tepo_verl.core.options import TepoOptions
from tepo_verl.verl_adapter.config import TEPO_LOSS_MODE

TEPO_POLICY_LOSS_TARGET = "tepo_verl.verl_adapter.config.TepoPolicyLossConfig"


#: verl's defaults for the keys of MASK_INPUTS, for configs that leave them out.
_DEFAULTS = {"actor_rollout_ref.actor.calculate_entropy": False}


class TepoConfigError(ValueError):
    pass


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for key in dotted.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(key, None)
    return default if node is None else node


def tepo_config_problems(config: Any) -> list[str]:
    """Every TEPO misconfiguration of a full verl config (DictConfig of ppo_trainer), as messages."""
    actor = _get(config, "actor_rollout_ref.actor")
    policy_loss = _get(actor, "policy_loss")
    problems: list[str] = []
    if policy_loss is None:
        return problems
    has_tepo_options = policy_loss.get("tepo", None) is not None
    if has_tepo_options and policy_loss.get("_target_", None) != TEPO_POLICY_LOSS_TARGET:
        problems.append(
            "actor_rollout_ref.actor.policy_loss.tepo is set but policy_loss._target_ is "
            f"{policy_loss.get('_target_', None)!r}; set policy_loss._target_={TEPO_POLICY_LOSS_TARGET} "
            "(the tepo presets do), or verl's PolicyLossConfig will reject the 'tepo' key"
        )
    if policy_loss.get("loss_mode", "vanilla") != TEPO_LOSS_MODE:
        return problems
    try:
        options = TepoOptions.from_mapping(dict(policy_loss.get("tepo", None) or {}))
    except ValueError as error:
        problems.append(str(error))
        return problems

    if _get(config, "algorithm.rollout_correction.bypass_mode", False):
        problems.append(
            "policy_loss.loss_mode=tepo with algorithm.rollout_correction.bypass_mode=True: verl would silently "
            "replace the loss by 'bypass_mode' and TEPO would not run. Set "
            "algorithm.rollout_correction.bypass_mode=False."
        )
    uses_reference = bool(_get(config, "algorithm.use_kl_in_reward", False)) or bool(actor.get("use_kl_loss", False))
    if options.kl_target == "ref" and options.mask_rule != "off" and not uses_reference:
        problems.append(
            "policy_loss.tepo.kl_target=ref needs a reference model, and none runs: set "
            "actor_rollout_ref.actor.use_kl_loss=True (with kl_loss_coef=0 to add no other KL term) or "
            "algorithm.use_kl_in_reward=True, or use kl_target=old."
        )
    available = {name for name, needed in MASK_INPUTS.items() if needed.config_key is None
                 or bool(_get(config, needed.config_key, _DEFAULTS[needed.config_key])) == needed.config_value}
    if actor.get("entropy_coeff", 0.0) != 0.0:  # verl computes the current entropy for an entropy bonus too
        available.add("entropy")
    fallback_ok = options.mask_fallback != "none" and set(required_inputs(options.mask_fallback)) <= available
    if not fallback_ok:
        for name in required_inputs(options.mask_rule):
            if name not in available:
                needed = MASK_INPUTS[name]
                problems.append(
                    f"policy_loss.tepo.mask_rule={options.mask_rule} needs {needed.meaning}: set "
                    f"{needed.config_key}={needed.config_value}, or choose another mask_rule "
                    f"({', '.join(MASK_RULES)}) or an explicit policy_loss.tepo.mask_fallback=surprisal_old|off"
                )
    return problems


def tepo_config_warnings(config: Any) -> list[str]:
    """What a valid TEPO config should know before it runs, one line each."""
    policy_loss = _get(config, "actor_rollout_ref.actor.policy_loss")
    if policy_loss is None or policy_loss.get("loss_mode", "vanilla") != TEPO_LOSS_MODE:
        return []
    warnings = []
    rejection = _get(config, "algorithm.rollout_correction.rollout_rs", None)
    if rejection and not _get(config, "algorithm.rollout_correction.bypass_mode", False):
        warnings.append(
            f"[tepo-verl] WARNING: algorithm.rollout_correction.rollout_rs={rejection} rejects tokens by zeroing "
            "response_mask, but verl's loss normalisation still counts them (batch_num_tokens is taken from the "
            "rollout's loss_mask, global_batch_size counts rejected responses), so every verl loss, TEPO's too, is "
            "scaled down by the accepted share of each mini-batch. TEPO keeps that normalisation, so it stays "
            "comparable with verl's GRPO, DAPO and GSPO under the same rejection; its tepo/ metrics count accepted "
            "tokens only, and with a token-level mode (token_k*) a response's ratio s_i is the geometric mean over "
            "its accepted tokens (docs/algorithm.md)."
        )
    return warnings


_TO_FSDP = ("compose verl's default (FSDP) config instead: drop --config-name ppo_megatron_trainer / "
            "model_engine=megatron")
#: strategy -> (the config section verl's engine of that strategy reads, how to compose a config that has it)
_ENGINE_SECTIONS = {
    "megatron": ("megatron", "compose verl's Megatron config instead: python -m verl.trainer.main_ppo --config-name "
                             "ppo_megatron_trainer ... (or model_engine=megatron), which sets the strategy itself"),
    "fsdp": ("fsdp_config", _TO_FSDP),
    "fsdp2": ("fsdp_config", _TO_FSDP),
}


def engine_config_problem(config: Any) -> str | None:
    """A strategy override on a config composed for another engine (e.g. strategy=megatron on the FSDP config, which
    verl would reject with an OmegaConf traceback, or crash on at worker start), as one line."""
    for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref"):
        node = _get(config, role)
        strategy = _get(node, "strategy")
        if strategy in _ENGINE_SECTIONS and node.get(_ENGINE_SECTIONS[strategy][0], None) is None:
            section, remedy = _ENGINE_SECTIONS[strategy]
            return (f"{role}.strategy={strategy} on a config without {role}.{section} (composed for another "
                    f"engine): {remedy}")
    return None


def check_tepo_config(config: Any) -> None:
    engine_problem = engine_config_problem(config)
    if engine_problem:
        raise TepoConfigError(engine_problem)
    for warning in tepo_config_warnings(config):
        print(warning, file=sys.stderr, flush=True)
    problems = tepo_config_problems(config)
    if problems:
        raise TepoConfigError("TEPO configuration error(s):\n" + "\n".join(f"  - {p}" for p in problems))
