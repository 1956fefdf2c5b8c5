"""`tepo` in verl's advantage-estimator and policy-loss registries (thin wrappers over tepo_verl.core and, for the
advantage, verl's GRPO estimator)."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import (
    AdvantageEstimator,
    agg_loss,
    get_adv_estimator_fn,
    register_adv_est,
    register_policy_loss,
)
from verl.utils.metric import AggregationType, Metric

from tepo_verl.core.advantage import without_signal
from tepo_verl.core.loss import MissingInputError, TepoLossOutput, tepo_policy_loss
from tepo_verl.core.mask import MASK_INPUTS
from tepo_verl.verl_adapter.actor_loss import current_extras
from tepo_verl.verl_adapter.config import TEPO_ADV_ESTIMATOR, TEPO_LOSS_MODE, clip_ratios, tepo_options
from tepo_verl.verl_adapter.ratio_metric import FirstMiniBatchMetric, RatioMetric

#: What provides the reference log-probs (kl_target=ref); the mask rules' tensors are in core.mask.MASK_INPUTS.
REF_LOG_PROB_PROVIDER = ("the reference log-probs: a reference model, i.e. actor_rollout_ref.actor.use_kl_loss=True "
                         "(kl_loss_coef may be 0) or algorithm.use_kl_in_reward=True")
#: How a tensor that no config key switches on reaches the loss: verl's main_ppo stores it on either trainer.
STORED_PROVIDER = ("run through verl's main_ppo: the v1 trainer stores it; on the legacy trainer "
                   "(trainer.use_v1=False) tepo-verl keeps it once the trainer's process has passed the config to "
                   "verl.utils.config.validate_config, as main_ppo_v0's TaskRunner does")


def provider(name: str) -> str:
    """How a verl user provides the optional tensor `name` (one line, for error messages)."""
    if name == "ref_log_prob":
        return REF_LOG_PROB_PROVIDER
    needed = MASK_INPUTS[name]
    if needed.config_key is None:
        return f"{needed.meaning}: {STORED_PROVIDER}"
    return f"{needed.meaning}: set {needed.config_key}={needed.config_value}"


def missing_input_message(error: MissingInputError) -> str:
    lines = [f"{error}. Provide:"] + [f"  - {name}: {provider(name)}" for name in error.missing]
    lines.append(
        "or choose an explicit fallback: actor_rollout_ref.actor.policy_loss.tepo.mask_fallback=surprisal_old|off"
    )
    return "\n".join(lines)


@register_adv_est(TEPO_ADV_ESTIMATOR)
def compute_tepo_outcome_advantage(
    token_level_rewards: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    index: np.ndarray,  # (B,) prompt uid
    epsilon: float = 1e-6,
    config: Any = None,  # the `algorithm` config
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor]:  # advantages (B, T), returns (B, T)
    """Step 1: verl's GRPO advantage (`algorithm.norm_adv_by_std_in_grpo` switches its std normalisation), with
    A = 0 for every response whose group has no spread of rewards: alone in its group, or all rewards equal
    (docs/algorithm.md, "The advantage estimator")."""
    norm_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    grpo = get_adv_estimator_fn(AdvantageEstimator.GRPO)
    advantages, _ = grpo(token_level_rewards, response_mask, index, epsilon=epsilon,
                         norm_adv_by_std_in_grpo=norm_by_std, config=config)  # (B, T)
    alone_or_equal = without_signal(token_level_rewards.sum(dim=-1), index)  # (B,)
    advantages = advantages.masked_fill(alone_or_equal.unsqueeze(-1), 0.0)
    return advantages, advantages


@register_policy_loss(TEPO_LOSS_MODE)
def compute_policy_loss_tepo(
    old_log_prob: torch.Tensor,  # (B, T)
    log_prob: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    loss_agg_mode: str = "token-mean",
    config: Any = None,  # verl ActorConfig (or a DictConfig of the actor section)
    rollout_is_weights: torch.Tensor | None = None,  # (B, T)
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The TEPO loss behind verl's registry. Entropies/ref log-probs come from the ppo_loss adapter's context."""
    if config is None:
        raise ValueError("the tepo policy loss needs the actor config (clip ratios, TEPO options)")
    options = tepo_options(config)
    extras = current_extras()
    global_batch_info = dict(config.get("global_batch_info", None) or {})
    low, high = clip_ratios(config)
    try:
        out = tepo_policy_loss(
            log_prob,
            old_log_prob,
            advantages,
            response_mask,
            clip_ratio_low=low,
            clip_ratio_high=high,
            options=options,
            entropy=None if extras is None else extras.entropy,
            old_entropy=None if extras is None else extras.old_entropy,
            ref_log_prob=None if extras is None else extras.ref_log_prob,
            rollout_is_weights=rollout_is_weights,
            aggregate=partial(agg_loss, loss_agg_mode=loss_agg_mode, **global_batch_info),
        )
    except MissingInputError as error:
        raise ValueError(missing_input_message(error)) from error
    return out.loss, verl_metrics(out, extras)


#: The core metrics logged as `tepo/<name>` (docs/plugin.md "Metrics"); the ratios are token- (or response-) weighted.
TEPO_METRICS = ("mask_frac", "mask_frac_positive", "masked_kl_mean", "penalty_grad_share", "masked_clipfrac",
                "seq_ratio_mean", "seq_clipfrac", "entropy", "entropy_delta", "surprisal_disagreement",
                "token_log_ratio_abs_mean", "seq_ratio_min", "seq_ratio_max", "token_log_ratio_abs_max",
                "seq_log_ratio_abs_max")
#: Extremes also logged as `tepo/onpolicy_<name>`: over the step's first mini-batch alone, the on-policy update,
#: where they measure the numerical noise of l - l_old (through the ppo_loss adapter only).
ON_POLICY_METRICS = ("token_log_ratio_abs_max", "seq_log_ratio_abs_max")
_EXTREME_AGGREGATION = {"min": AggregationType.MIN, "max": AggregationType.MAX}


def verl_metrics(out: TepoLossOutput, extras) -> dict[str, Any]:
    """Name the core metrics for verl's metric path.

    Through the ppo_loss adapter (`extras` given) every `tepo/` ratio goes out as a RatioMetric of its two sums and
    the extremes with MIN/MAX aggregation, so that verl's reduction over micro-batches, ranks and mini-batches
    gives the step's value; ON_POLICY_METRICS also as `tepo/onpolicy_<name>`, the first mini-batch's value. verl's own
    `actor/` names keep verl's convention (the mean of per-micro-batch values, as every verl loss logs them), so they
    stay comparable across loss modes. Called without the adapter (verl's registry alone), every metric is this
    micro-batch's plain value.
    """
    core, parts = out.metrics, out.metric_parts
    metrics: dict[str, Any] = {
        "actor/pg_clipfrac": core["token_clipfrac"],
        "actor/pg_clipfrac_lower": core["token_clipfrac_lower"],
        "actor/ppo_kl": core["ppo_kl"],
        f"tepo/mask_rule/{out.mask_rule}": 1.0,
        "tepo/mask_fallback_used": float(out.mask_fallback_used),
    }
    for name in TEPO_METRICS:
        if name not in core:
            continue
        if extras is None:
            metrics[f"tepo/{name}"] = core[name]
        elif name in parts.ratios:
            ratio = parts.ratios[name]
            extras.metrics[f"tepo/{name}"] = RatioMetric(ratio.num, ratio.den, ratio.empty)
        else:
            value, kind = parts.extremes[name]
            extras.metrics[f"tepo/{name}"] = Metric(aggregation=_EXTREME_AGGREGATION[kind], value=value)
            if name in ON_POLICY_METRICS:
                extras.metrics[f"tepo/onpolicy_{name}"] = FirstMiniBatchMetric(_EXTREME_AGGREGATION[kind], value)
    return metrics
