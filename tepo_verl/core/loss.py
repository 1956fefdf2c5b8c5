"""The TEPO policy loss (spec "Reconstruction" 2-6), pure torch.

Per token (i, t), with s_it the straight-through sequence (or prefix) ratio and M_it the KL mask:

    pg_it   = -min(s_it A_i, clip(s_it, 1 - e_low, 1 + e_high) A_i)          (x rollout IS weight, if given)
    loss_it = pg_it + beta * M_it * D_it      (mask_action = "penalty")
    loss_it = pg_it * (1 - M_it)              (mask_action = "drop")
    loss    = aggregate(loss_it over valid tokens)   (token-mean over the global mini-batch by default)

`aggregate` is injected (the verl adapter passes verl's `agg_loss` with the global batch info) so the core
stays free of verl.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from tepo_verl.core.kl import kl_estimate
from tepo_verl.core.mask import entropy_falling, kl_mask, required_inputs
from tepo_verl.core.options import TepoOptions
from tepo_verl.core.ratio import prefix_log_ratio, sequence_log_ratio, straight_through_log_ratio

Aggregator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (loss_mat (B,T), mask (B,T)) -> scalar


def token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the valid tokens of one batch (spec 4); 0 for a batch with no valid token."""
    mask = mask.to(loss_mat.dtype)
    return (loss_mat * mask).sum() / mask.sum().clamp(min=1)


class MissingInputError(ValueError):
    """A tensor the configured rule needs was not given; `.missing` names it ("entropy", "old_entropy", ...)."""

    def __init__(self, what: str, missing: list[str]):
        super().__init__(f"{what} needs {missing}, which were not given")
        self.missing = missing


def resolve_mask_rule(options: TepoOptions, available: set[str]) -> tuple[str, bool]:
    """The mask rule that will run given the optional tensors `available`, and whether it is the fallback.

    Raises MissingInputError when the configured rule cannot run and `mask_fallback` is "none" (or the
    fallback cannot run either).
    """
    missing = [name for name in required_inputs(options.mask_rule) if name not in available]
    if not missing:
        return options.mask_rule, False
    if options.mask_fallback != "none":
        fallback_missing = [n for n in required_inputs(options.mask_fallback) if n not in available]
        if not fallback_missing:
            return options.mask_fallback, True
        missing += fallback_missing
    raise MissingInputError(f"TEPO mask rule {options.mask_rule!r}", sorted(set(missing)))


@dataclasses.dataclass
class TepoLossOutput:
    loss: torch.Tensor  # () aggregated loss
    token_loss: torch.Tensor  # (B, T) per-token loss, 0 on padding
    mask: torch.Tensor  # (B, T) bool, the KL mask M
    seq_ratio: torch.Tensor  # (B,) s_i of each response (detached)
    mask_rule: str  # the rule that actually ran
    mask_fallback_used: bool
    metrics: dict[str, float]


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = mask.sum()
    if count == 0:
        return 0.0
    return float(torch.where(mask, values, torch.zeros_like(values)).sum() / count)


def tepo_policy_loss(
    log_prob: torch.Tensor,  # (B, T) current policy, with gradient
    old_log_prob: torch.Tensor,  # (B, T) old (sampling) policy
    advantages: torch.Tensor,  # (B, T) A_i broadcast over tokens
    response_mask: torch.Tensor,  # (B, T) 1 on valid tokens
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    options: TepoOptions = TepoOptions(),
    entropy: torch.Tensor | None = None,  # (B, T) current-policy entropy H
    old_entropy: torch.Tensor | None = None,  # (B, T) old-policy entropy H_old
    ref_log_prob: torch.Tensor | None = None,  # (B, T) reference-model log-probs
    rollout_is_weights: torch.Tensor | None = None,  # (B, T) rollout-correction IS weights
    aggregate: Aggregator = token_mean,
) -> TepoLossOutput:
    """TEPO loss and metrics for one micro-batch. See the module docstring for the formula."""
    if not (log_prob.shape == old_log_prob.shape == advantages.shape == response_mask.shape):
        raise ValueError(
            f"shape mismatch: log_prob {tuple(log_prob.shape)}, old_log_prob {tuple(old_log_prob.shape)}, "
            f"advantages {tuple(advantages.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    available = {name for name, t in (("entropy", entropy), ("old_entropy", old_entropy)) if t is not None}
    rule, fell_back = resolve_mask_rule(options, available)
    if options.kl_target == "ref" and options.mask_rule != "off" and ref_log_prob is None:
        raise MissingInputError("TEPO kl_target='ref'", ["ref_log_prob"])

    # Compute in at least float32 (bf16 inputs are upcast; float64 stays float64).
    dtype = torch.promote_types(log_prob.dtype, torch.float32)
    valid = response_mask.bool()  # (B, T)
    log_prob = log_prob.to(dtype)
    old_log_prob = old_log_prob.to(dtype).detach()
    advantages = advantages.to(dtype).detach()

    # Spec 2: sequence (or prefix) log-ratio, carried by each token in straight-through form.
    seq_log_ratio = sequence_log_ratio(log_prob, old_log_prob, valid)  # (B,)
    if options.ratio_mode == "sequence":
        log_ratio = seq_log_ratio  # (B,)
    else:
        log_ratio = prefix_log_ratio(log_prob, old_log_prob, valid)  # (B, T)
    log_ratio_tok = straight_through_log_ratio(log_ratio, log_prob)  # (B, T)
    log_ratio_tok = torch.clamp(log_ratio_tok, max=options.log_ratio_clamp)  # verl's GSPO clamp
    ratio = torch.exp(log_ratio_tok)  # (B, T)

    # Spec 3: clipped surrogate.
    pg_unclipped = -advantages * ratio  # (B, T)
    pg_clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)  # (B, T)
    pg = torch.maximum(pg_unclipped, pg_clipped)  # (B, T)
    if rollout_is_weights is not None:
        pg = pg * rollout_is_weights.to(dtype).detach()

    # Spec 5: KL mask and penalty.
    falling = entropy_falling(
        rule,
        log_prob.detach(),
        old_log_prob,
        None if entropy is None else entropy.detach().to(dtype),
        None if old_entropy is None else old_entropy.detach().to(dtype),
    )  # (B, T) bool
    mask = kl_mask(advantages, valid, falling)  # (B, T) bool
    if options.kl_target == "old":
        target = old_log_prob
    else:
        target = None if ref_log_prob is None else ref_log_prob.to(dtype).detach()
    if options.mask_rule == "off" or target is None:
        kl = torch.zeros_like(log_prob)  # (B, T)
    else:
        kl = kl_estimate(log_prob, target, options.kl_estimator)  # (B, T)
    if options.mask_action == "penalty":
        token_loss = pg + options.kl_coef * torch.where(mask, kl, torch.zeros_like(kl))
    else:
        token_loss = torch.where(mask, torch.zeros_like(pg), pg)
    token_loss = torch.where(valid, token_loss, torch.zeros_like(token_loss))  # padding never leaks NaN/Inf

    # Spec 4: token-level aggregation (injected).
    loss = aggregate(token_loss, valid)

    metrics = _metrics(
        valid, mask, kl, seq_log_ratio, options, pg_clipped, pg_unclipped, advantages, log_prob, old_log_prob,
        entropy, old_entropy,
    )
    return TepoLossOutput(
        loss=loss,
        token_loss=token_loss,
        mask=mask,
        seq_ratio=torch.exp(torch.clamp(seq_log_ratio.detach(), max=options.log_ratio_clamp)),
        mask_rule=rule,
        mask_fallback_used=fell_back,
        metrics=metrics,
    )


def _metrics(
    valid, mask, kl, seq_log_ratio, options, pg_clipped, pg_unclipped, advantages, log_prob, old_log_prob,
    entropy, old_entropy,
) -> dict[str, float]:
    """Spec 6 metrics for this micro-batch (all plain floats, 0 where undefined)."""
    with torch.no_grad():
        nonempty = valid.any(dim=-1)  # (B,)
        seq_ratio = torch.exp(torch.clamp(seq_log_ratio, max=options.log_ratio_clamp))[nonempty]  # (B',)
        clipped = pg_clipped > pg_unclipped  # (B, T)
        seq_clipped = (clipped & valid).any(dim=-1)[nonempty]  # (B',)
        n_valid = int(valid.sum())
        metrics = {
            "mask_frac": float(mask.sum()) / n_valid if n_valid else 0.0,
            "masked_kl_mean": _masked_mean(kl, mask),
            "seq_ratio_mean": float(seq_ratio.mean()) if seq_ratio.numel() else 1.0,
            "seq_ratio_min": float(seq_ratio.min()) if seq_ratio.numel() else 1.0,
            "seq_ratio_max": float(seq_ratio.max()) if seq_ratio.numel() else 1.0,
            "seq_clipfrac": float(seq_clipped.sum()) / seq_clipped.numel() if seq_clipped.numel() else 0.0,
            "token_clipfrac": _masked_mean(clipped.to(log_prob.dtype), valid),
            "token_clipfrac_lower": _masked_mean((clipped & (advantages < 0)).to(log_prob.dtype), valid),
            "ppo_kl": _masked_mean(old_log_prob - log_prob, valid),
        }
        if entropy is not None:
            metrics["entropy"] = _masked_mean(entropy.to(log_prob.dtype), valid)
            if old_entropy is not None:
                metrics["entropy_delta"] = _masked_mean((entropy - old_entropy).to(log_prob.dtype), valid)
    return metrics
