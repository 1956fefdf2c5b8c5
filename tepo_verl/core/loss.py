"""The TEPO policy loss (docs/algorithm.md, steps 2-5), pure torch, plain autograd.

    log s_i  = (1/|o_i|) sum_t (l_it - l^old_it)                       sequence log-ratio (prefix: tokens 1..t)
    s_it     = exp(sg[log s_i] + l_it - sg[l_it])                       every token carries its sequence's ratio
    pg_it    = -min(s_it A_i, clip(s_it, 1 - e_low, 1 + e_high) A_i)    (x rollout IS weight, if given)
    M_it     = [A_i > 0] [entropy falling at (i, t)]                    the KL mask (core/mask.py; options below)
    loss_it  = pg_it + beta M_it D_it        (mask_action = penalty; D: KL estimate against the old or ref policy)
    loss_it  = pg_it (1 - M_it)              (mask_action = drop)
    loss     = aggregate(loss_it over valid tokens)                     token-mean over the global mini-batch

Controls (our own, not the paper's): `mask_advantage=any` drops the [A_i > 0] factor; `mask_top_frac=f` keeps only
the top f of the masked tokens of the micro-batch by p_it (l_it + H_it) A_i (on the tensors the rule reads).

`aggregate` is injected (the verl adapter passes verl's `agg_loss` with the global batch info), so the core stays
free of verl.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from tepo_verl.core.kl import kl_estimate
from tepo_verl.core.mask import entropy_decrease_score, entropy_falling, required_inputs, top_fraction
from tepo_verl.core.metrics import LossMetrics, loss_metrics
from tepo_verl.core.options import TepoOptions
from tepo_verl.core.ratio import prefix_log_ratio, sequence_log_ratio, straight_through_log_ratio, token_log_ratio

Aggregator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (loss_mat (B,T), mask (B,T)) -> scalar


def token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the valid tokens of one batch; 0 for a batch with no valid token."""
    mask = mask.to(loss_mat.dtype)
    return (loss_mat * mask).sum() / mask.sum().clamp(min=1)


class MissingInputError(ValueError):
    """A tensor the configured rule needs was not given; `.missing` names it ("entropy", "old_entropy", ...)."""

    def __init__(self, what: str, missing: list[str]):
        super().__init__(f"{what} needs {missing}, which were not given")
        self.missing = missing


def token_gradient(term: Callable[[torch.Tensor], torch.Tensor], log_prob: torch.Tensor) -> torch.Tensor:
    """d term_it / d l_it (B, T) for a term whose token (i, t) depends on l_it alone, by autograd on a detached
    copy of l (so the loss's own graph is untouched); 0 where the term does not depend on l."""
    with torch.enable_grad():
        leaf = log_prob.detach().requires_grad_(True)
        out = term(leaf)
        if not out.requires_grad:
            return torch.zeros_like(leaf)
        (grad,) = torch.autograd.grad(out.sum(), leaf, allow_unused=True)
    return torch.zeros_like(leaf) if grad is None else grad


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
    metrics: dict[str, float]  # every metric's value over this micro-batch
    metric_parts: LossMetrics  # the same metrics as sums, for aggregation across micro-batches and ranks


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
    """TEPO loss and metrics for one micro-batch: the module docstring's formula, step by step."""
    if not (log_prob.shape == old_log_prob.shape == advantages.shape == response_mask.shape):
        raise ValueError(
            f"shape mismatch: log_prob {tuple(log_prob.shape)}, old_log_prob {tuple(old_log_prob.shape)}, "
            f"advantages {tuple(advantages.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    rule, fell_back = resolve_mask_rule(options, {n for n, t in (("entropy", entropy), ("old_entropy", old_entropy))
                                                  if t is not None})
    if options.kl_target == "ref" and options.mask_rule != "off" and ref_log_prob is None:
        raise MissingInputError("TEPO kl_target='ref'", ["ref_log_prob"])
    valid = response_mask.bool()  # (B, T)
    dtype = torch.promote_types(log_prob.dtype, torch.float32)  # bf16 is upcast: a ratio of 1 +- 4e-4 needs it

    def clean(t: torch.Tensor | None, grad: bool = False) -> torch.Tensor | None:  # (B, T), 0 on padding
        return None if t is None else torch.where(valid, t if grad else t.detach(), 0).to(dtype)

    l, l_old, adv = clean(log_prob, grad=True), clean(old_log_prob), clean(advantages)  # (B, T) each
    h, h_old = clean(entropy), clean(old_entropy)  # (B, T) each, or None

    # 1. Ratio: the sequence (or prefix) log-ratio, carried by each token straight through its own log-prob.
    tok_log_ratio = token_log_ratio(l.detach(), l_old, valid)  # (B, T)
    seq_log_ratio = sequence_log_ratio(tok_log_ratio, valid)  # (B,)
    log_ratio = seq_log_ratio if options.ratio_mode == "sequence" else prefix_log_ratio(tok_log_ratio, valid)
    weights = clean(rollout_is_weights)  # (B, T) or None

    def policy_term(l: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # pg, s, clip(s): (B, T)
        ratio = torch.exp(torch.clamp(straight_through_log_ratio(log_ratio, l), max=options.log_ratio_clamp))
        clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)  # 2. Clip.
        pg = torch.maximum(-adv * ratio, -adv * clipped_ratio)  # 3. Surrogate.
        return (pg if weights is None else pg * weights), ratio, clipped_ratio

    pg, ratio, clipped_ratio = policy_term(l)  # (B, T) each

    # 4. KL mask: positive advantage (or, as a control, any valid token) and entropy falling; optionally only the
    # top fraction of those by their first-order entropy decrease p (l + H) A.
    falling = entropy_falling(rule, l.detach(), l_old, h, h_old, options.mask_old_rtol)  # (B, T) bool
    selectable = (adv > 0) if options.mask_advantage == "positive" else valid  # (B, T); A = 0 on padding
    mask = selectable & falling  # (B, T) bool
    if options.mask_top_frac < 1 and rule != "off":  # (the fallback rule off scores nothing and masks nothing)
        mask = top_fraction(mask, entropy_decrease_score(rule, l.detach(), l_old, h, h_old, adv),
                            options.mask_top_frac)

    # 5. Penalty on the masked tokens (or drop their policy term).
    target = l_old if options.kl_target == "old" else clean(ref_log_prob)

    def kl_term(l: torch.Tensor) -> torch.Tensor:  # (B, T) D_it, on every token (the mask applies below)
        return torch.zeros_like(l) if target is None else kl_estimate(l, target, options.kl_estimator)

    kl = kl_term(l)  # (B, T)
    if options.mask_action == "penalty":
        token_loss = pg + options.kl_coef * torch.where(mask, kl, 0)
    else:
        token_loss = torch.where(mask, 0, pg)
    token_loss = torch.where(valid, token_loss, 0)  # (B, T)

    # 6. Aggregate (injected: verl's agg_loss with the global batch info).
    loss = aggregate(token_loss, valid)

    # Metrics. The two terms' per-token gradients d pg_it / d l_it and d (beta D_it) / d l_it, for the penalty's
    # strength, come from autograd on a detached copy of l: each term of token (i, t) depends on l_it alone.
    policy_grad = token_gradient(lambda x: policy_term(x)[0], l)  # (B, T)
    penalty_grad = (options.kl_coef * token_gradient(kl_term, l) if options.mask_action == "penalty"
                    else torch.zeros_like(l))  # (B, T); drop adds no penalty term
    metrics = loss_metrics(valid, adv, mask, kl.detach(), seq_log_ratio, ratio.detach(), clipped_ratio.detach(),
                           options.log_ratio_clamp, h, h_old, l.detach(), l_old, policy_grad, penalty_grad)
    return TepoLossOutput(loss=loss, token_loss=token_loss, mask=mask,
                          seq_ratio=torch.exp(torch.clamp(seq_log_ratio, max=options.log_ratio_clamp)),
                          mask_rule=rule, mask_fallback_used=fell_back, metrics=metrics.values(),
                          metric_parts=metrics)
