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

from tepo_verl.core.kl import kl_estimate_and_grad
from tepo_verl.core.mask import entropy_falling, required_inputs
from tepo_verl.core.options import TepoOptions
from tepo_verl.core.ratio import prefix_log_ratio, sequence_log_ratio, token_log_ratio

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


class _PerTokenLoss(torch.autograd.Function):
    """token_loss with gradient grad_out * coef w.r.t. log_prob.

    With the straight-through ratio, every per-token loss depends on the current policy only through the token's
    own log-prob, so its gradient is one coefficient per token. Computing that coefficient in closed form keeps a
    single (B, T) tensor for backward instead of autograd's graph of about ten (see benchmarks/loss_cost.py)."""

    @staticmethod
    def forward(ctx, log_prob, token_loss, coef):
        ctx.save_for_backward(coef)
        ctx.log_prob_dtype = log_prob.dtype
        return token_loss

    @staticmethod
    def backward(ctx, grad_out):
        (coef,) = ctx.saved_tensors
        return (grad_out * coef).to(ctx.log_prob_dtype), None, None


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
    """TEPO loss and metrics for one micro-batch. See the module docstring for the formula.

    The per-token values and their straight-through derivatives d loss_it / d l_it are computed without autograd
    (the derivative conventions at ties and clamps are autograd's, so gradients equal those of the plain
    autograd formulation in tests/tepo_reference.py); the aggregation runs under autograd.
    """
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

    def upcast(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.detach().to(dtype)

    with torch.no_grad():
        valid = response_mask.bool()  # (B, T)
        l, l_old = upcast(log_prob), upcast(old_log_prob)  # (B, T) each
        # A with exact zeros on padding, so padding contributes 0 to the loss and its gradient whatever it holds.
        adv = torch.where(valid, upcast(advantages), 0.0)  # (B, T)
        positive, negative = adv > 0, adv < 0  # (B, T) bool each

        # Spec 2: log s_it = sg[log s] + l_it - sg[l_it] has the value of the sequence (or prefix) log-ratio and
        # derivative 1 w.r.t. l_it (0 where the GSPO clamp cuts it). Sequence mode keeps it per row: (B, 1).
        tok_log_ratio = token_log_ratio(l, l_old, valid)  # (B, T)
        lengths = torch.count_nonzero(valid, dim=-1)  # (B,)
        seq_log_ratio = sequence_log_ratio(tok_log_ratio, valid)  # (B,)
        if options.ratio_mode == "sequence":
            log_ratio = seq_log_ratio.unsqueeze(-1)  # (B, 1)
        else:
            log_ratio = prefix_log_ratio(tok_log_ratio, valid)  # (B, T)
        ratio = torch.exp(torch.clamp(log_ratio, max=options.log_ratio_clamp))  # s: (B, 1) or (B, T)
        dratio = torch.where(log_ratio <= options.log_ratio_clamp, ratio, 0.0)  # ds/dl

        # Spec 3: pg = max(-A s, -A clip(s)) = A * (-min(s, clip(s))) for A > 0 and A * (-max(s, clip(s))) for
        # A < 0. The unclipped branch wins (torch.maximum: ties split evenly, summing to the same) unless
        # s > 1 + e_high (A > 0) or s < 1 - e_low (A < 0); there d pg / d l = -A ds/dl, elsewhere 0.
        # Everything but the final select-and-multiply stays per row in sequence mode.
        low, high = 1 - clip_ratio_low, 1 + clip_ratio_high
        clipped_ratio = torch.clamp(ratio, low, high)
        clip_pos, clip_neg = ratio > high, ratio < low  # (B, 1) or (B, T) bool
        pg = adv * torch.where(positive, -torch.minimum(ratio, clipped_ratio), -torch.maximum(ratio, clipped_ratio))
        dpg = adv * torch.where(positive, torch.where(clip_pos, 0.0, -dratio), torch.where(clip_neg, 0.0, -dratio))
        if rollout_is_weights is not None:
            weights = upcast(rollout_is_weights)
            pg, dpg = pg * weights, dpg * weights

        # Spec 5: KL mask (A > 0 already excludes padding), then the penalty or the dropped policy term, computed
        # on the masked tokens only.
        target = l_old if options.kl_target == "old" else upcast(ref_log_prob)
        masked = None  # indices of M
        kl_masked = None  # (|M|,) D on M
        if options.mask_rule == "off" or target is None:
            mask = torch.zeros_like(valid)
            token_loss, coef = pg, dpg
        else:
            falling = entropy_falling(rule, l, l_old, upcast(entropy), upcast(old_entropy))  # (B, T) bool
            mask = positive & falling  # (B, T) bool
            masked = mask.nonzero(as_tuple=True)
            kl_masked, dkl_masked = kl_estimate_and_grad(l[masked], target[masked], options.kl_estimator)
            token_loss, coef = pg, dpg  # fresh tensors: safe to update in place
            if options.mask_action == "penalty":
                token_loss.index_put_(masked, options.kl_coef * kl_masked, accumulate=True)
                coef.index_put_(masked, options.kl_coef * dkl_masked, accumulate=True)
            else:
                token_loss[masked] = 0.0
                coef[masked] = 0.0

        seq_ratio = torch.exp(torch.clamp(seq_log_ratio, max=options.log_ratio_clamp))  # (B,) s_i
        metrics = _metrics(valid, lengths, mask, kl_masked, seq_log_ratio, seq_ratio, positive, negative,
                           clip_pos, clip_neg, upcast(entropy), upcast(old_entropy))

    token_loss = _PerTokenLoss.apply(log_prob, token_loss, coef) if log_prob.requires_grad else token_loss
    # Spec 4: token-level aggregation (injected).
    loss = aggregate(token_loss, valid)
    return TepoLossOutput(
        loss=loss,
        token_loss=token_loss,
        mask=mask,
        seq_ratio=seq_ratio,
        mask_rule=rule,
        mask_fallback_used=fell_back,
        metrics=metrics,
    )


def _metrics(valid, lengths, mask, kl_masked, seq_log_ratio, seq_ratio, positive, negative, clip_pos, clip_neg,
             entropy, old_entropy):
    """Spec 6 metrics for this micro-batch (plain floats, 0 where undefined), read with one device sync."""
    dtype = seq_log_ratio.dtype
    nonempty = lengths > 0  # (B,)
    seq_ratio = seq_ratio[nonempty]  # (B',)
    one = torch.ones((), dtype=dtype, device=seq_log_ratio.device)
    if clip_pos.shape[-1] == 1:  # per-row clip decisions (sequence mode): count tokens per row
        n_pos, n_neg = torch.count_nonzero(positive, dim=-1), torch.count_nonzero(negative, dim=-1)  # (B,)
        cp, cn = clip_pos.squeeze(-1), clip_neg.squeeze(-1)  # (B,)
        n_clipped_lower = (n_neg * cn).sum()
        n_clipped = (n_pos * cp).sum() + n_clipped_lower
        n_seq_clipped = (((n_pos > 0) & cp) | ((n_neg > 0) & cn)).sum()
    else:
        clipped_lower = negative & clip_neg  # (B, T)
        clipped = (positive & clip_pos) | clipped_lower  # (B, T)
        n_clipped, n_clipped_lower = torch.count_nonzero(clipped), torch.count_nonzero(clipped_lower)
        n_seq_clipped = clipped.any(dim=-1).sum()
    sums = {
        "n_valid": lengths.sum(),
        "n_masked": torch.count_nonzero(mask),
        "kl_masked": one * 0 if kl_masked is None else kl_masked.sum(),
        "n_seq": nonempty.sum(),
        "n_seq_clipped": n_seq_clipped,
        "n_clipped": n_clipped,
        "n_clipped_lower": n_clipped_lower,
        "old_minus_new": -(seq_log_ratio * lengths).sum(),
        "ratio_sum": seq_ratio.sum(),
        "ratio_min": seq_ratio.min() if seq_ratio.numel() else one,
        "ratio_max": seq_ratio.max() if seq_ratio.numel() else one,
    }
    if entropy is not None:
        sums["entropy"] = torch.where(valid, entropy, 0.0).sum()
        if old_entropy is not None:
            sums["old_entropy"] = torch.where(valid, old_entropy, 0.0).sum()
    v = dict(zip(sums, torch.stack([t.to(dtype) for t in sums.values()]).tolist()))

    def ratio(num: float, den: float, empty: float = 0.0) -> float:
        return num / den if den else empty

    metrics = {
        "mask_frac": ratio(v["n_masked"], v["n_valid"]),
        "masked_kl_mean": ratio(v["kl_masked"], v["n_masked"]),
        "seq_ratio_mean": ratio(v["ratio_sum"], v["n_seq"], 1.0),
        "seq_ratio_min": v["ratio_min"],
        "seq_ratio_max": v["ratio_max"],
        "seq_clipfrac": ratio(v["n_seq_clipped"], v["n_seq"]),
        "token_clipfrac": ratio(v["n_clipped"], v["n_valid"]),
        "token_clipfrac_lower": ratio(v["n_clipped_lower"], v["n_valid"]),
        "ppo_kl": ratio(v["old_minus_new"], v["n_valid"]),
    }
    if "entropy" in v:
        metrics["entropy"] = ratio(v["entropy"], v["n_valid"])
        if "old_entropy" in v:
            metrics["entropy_delta"] = ratio(v["entropy"] - v["old_entropy"], v["n_valid"])
    return metrics
