"""Per-micro-batch metrics of the TEPO loss (docs/algorithm.md "Metrics"), computed without gradient, one sync.

Every metric but the extremes is a ratio of two sums over the micro-batch's tokens or responses (a `Ratio`).
The loss reports each as its value and as its two sums, so that the verl adapter can log the parts and verl's
aggregation over micro-batches and data-parallel ranks yields the ratio of the global sums: the value over the
whole mini-batch, weighted by tokens as the loss is (not the unweighted mean of per-micro-batch ratios).
"""

from __future__ import annotations

import dataclasses

import torch

from tepo_verl.core.mask import entropy_falling


@dataclasses.dataclass(frozen=True)
class Ratio:
    """num / den, two sums over one micro-batch; `empty` where den == 0 (nothing to measure). Each ratio below has a
    den that is 0 only where its num is 0 too, so none is ever infinite."""

    num: float
    den: float
    empty: float = 0.0

    @property
    def value(self) -> float:
        return ratio_value(self.num, self.den, self.empty)


def ratio_value(num: float, den: float, empty: float) -> float:
    return num / den if den else empty


@dataclasses.dataclass(frozen=True)
class LossMetrics:
    ratios: dict[str, Ratio]  # summable metrics, by name
    extremes: dict[str, tuple[float, str]]  # name -> (value, "min" | "max")

    def values(self) -> dict[str, float]:
        return {name: r.value for name, r in self.ratios.items()} | {n: v for n, (v, _) in self.extremes.items()}


@torch.no_grad()
def loss_metrics(
    valid: torch.Tensor,  # (B, T) bool
    adv: torch.Tensor,  # (B, T) A, 0 on padding
    mask: torch.Tensor,  # (B, T) bool, the KL mask M
    kl: torch.Tensor,  # (B, T) D
    seq_log_ratio: torch.Tensor,  # (B,) log s_i
    ratio: torch.Tensor,  # (B, T) s_it
    clipped_ratio: torch.Tensor,  # (B, T) clip(s_it)
    log_ratio_clamp: float,
    entropy: torch.Tensor | None,  # (B, T) H, 0 on padding
    old_entropy: torch.Tensor | None,  # (B, T) H_old, 0 on padding
    log_prob: torch.Tensor,  # (B, T) l, 0 on padding
    old_log_prob: torch.Tensor,  # (B, T) l_old, 0 on padding
    policy_grad: torch.Tensor,  # (B, T) d pg_it / d l_it
    penalty_grad: torch.Tensor,  # (B, T) d (beta D_it) / d l_it where the loss adds the penalty, else 0
) -> LossMetrics:
    """The metrics of one micro-batch (docs/plugin.md "Metrics"); ratio statistics of a batch with no response are 1."""
    nonempty = valid.any(dim=-1)  # (B,)
    seq_ratio = torch.exp(torch.clamp(seq_log_ratio, max=log_ratio_clamp))[nonempty]  # (B',)
    clipped = valid & (-adv * clipped_ratio > -adv * ratio)  # (B, T) the clipped branch won
    positive = valid & (adv > 0)  # (B, T)
    one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
    abs_log_ratio = torch.where(valid, log_prob - old_log_prob, 0).abs()  # (B, T) |l - l_old|
    sums = {
        "n_valid": valid.sum(),
        "n_positive": positive.sum(),
        "n_masked": mask.sum(),
        "n_masked_positive": (mask & positive).sum(),
        "kl_masked": torch.where(mask, kl, 0).sum(),
        "penalty_grad_masked": torch.where(mask, penalty_grad.abs(), 0).sum(),
        "policy_grad_masked": torch.where(mask, policy_grad.abs(), 0).sum(),
        "n_masked_clipped": (mask & clipped).sum(),
        "n_seq": nonempty.sum(),
        "n_seq_clipped": clipped.any(dim=-1).sum(),
        "n_clipped": clipped.sum(),
        "n_clipped_lower": (clipped & (adv < 0)).sum(),
        "old_minus_new": (old_log_prob - log_prob).sum(),
        "abs_log_ratio": abs_log_ratio.sum(),
        "abs_log_ratio_max": abs_log_ratio.max() if abs_log_ratio.numel() else 0 * one,
        "ratio_sum": seq_ratio.sum(),
        "ratio_min": seq_ratio.min() if seq_ratio.numel() else one,
        "ratio_max": seq_ratio.max() if seq_ratio.numel() else one,
        "seq_log_ratio_abs_max": seq_log_ratio[nonempty].abs().max() if seq_ratio.numel() else 0 * one,
    }
    if entropy is not None:
        sums["entropy"] = entropy.sum()
        if old_entropy is not None:
            sums["old_entropy"] = old_entropy.sum()
            current = positive & entropy_falling("surprisal", log_prob, old_log_prob, entropy=entropy)
            stored = positive & entropy_falling("surprisal_old", log_prob, old_log_prob, old_entropy=old_entropy)
            sums["n_disagree"] = (current != stored).sum()
    v = dict(zip(sums, torch.stack([t.to(ratio.dtype) for t in sums.values()]).tolist()))

    ratios = {
        "mask_frac": Ratio(v["n_masked"], v["n_valid"]),
        "mask_frac_positive": Ratio(v["n_masked_positive"], v["n_positive"]),
        "masked_kl_mean": Ratio(v["kl_masked"], v["n_masked"]),
        "penalty_grad_share": Ratio(v["penalty_grad_masked"], v["penalty_grad_masked"] + v["policy_grad_masked"]),
        "masked_clipfrac": Ratio(v["n_masked_clipped"], v["n_masked"]),
        "seq_ratio_mean": Ratio(v["ratio_sum"], v["n_seq"], 1.0),
        "seq_clipfrac": Ratio(v["n_seq_clipped"], v["n_seq"]),
        "token_clipfrac": Ratio(v["n_clipped"], v["n_valid"]),
        "token_clipfrac_lower": Ratio(v["n_clipped_lower"], v["n_valid"]),
        "ppo_kl": Ratio(v["old_minus_new"], v["n_valid"]),
        "token_log_ratio_abs_mean": Ratio(v["abs_log_ratio"], v["n_valid"]),
    }
    if "entropy" in v:
        ratios["entropy"] = Ratio(v["entropy"], v["n_valid"])
        if "old_entropy" in v:
            ratios["entropy_delta"] = Ratio(v["entropy"] - v["old_entropy"], v["n_valid"])
            ratios["surprisal_disagreement"] = Ratio(v["n_disagree"], v["n_valid"])
    extremes = {"seq_ratio_min": (v["ratio_min"], "min"), "seq_ratio_max": (v["ratio_max"], "max"),
                "token_log_ratio_abs_max": (v["abs_log_ratio_max"], "max"),
                "seq_log_ratio_abs_max": (v["seq_log_ratio_abs_max"], "max")}
    return LossMetrics(ratios=ratios, extremes=extremes)
