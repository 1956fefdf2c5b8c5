"""Per-micro-batch metrics of the TEPO loss (README "Metrics"), computed without gradient, read with one sync."""

from __future__ import annotations

import torch

from tepo_verl.core.mask import entropy_falling


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
) -> dict[str, float]:
    """Plain floats; 0 where undefined (1 for the ratio statistics of a batch with no response)."""
    nonempty = valid.any(dim=-1)  # (B,)
    seq_ratio = torch.exp(torch.clamp(seq_log_ratio, max=log_ratio_clamp))[nonempty]  # (B',)
    clipped = valid & (-adv * clipped_ratio > -adv * ratio)  # (B, T) the clipped branch won
    one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
    sums = {
        "n_valid": valid.sum(),
        "n_masked": mask.sum(),
        "kl_masked": torch.where(mask, kl, 0).sum(),
        "n_seq": nonempty.sum(),
        "n_seq_clipped": clipped.any(dim=-1).sum(),
        "n_clipped": clipped.sum(),
        "n_clipped_lower": (clipped & (adv < 0)).sum(),
        "old_minus_new": (old_log_prob - log_prob).sum(),
        "ratio_sum": seq_ratio.sum(),
        "ratio_min": seq_ratio.min() if seq_ratio.numel() else one,
        "ratio_max": seq_ratio.max() if seq_ratio.numel() else one,
    }
    if entropy is not None:
        sums["entropy"] = entropy.sum()
        if old_entropy is not None:
            sums["old_entropy"] = old_entropy.sum()
            positive = adv > 0
            current = positive & entropy_falling("surprisal", log_prob, old_log_prob, entropy=entropy)
            stored = positive & entropy_falling("surprisal_old", log_prob, old_log_prob, old_entropy=old_entropy)
            sums["n_disagree"] = (current != stored).sum()
    v = dict(zip(sums, torch.stack([t.to(ratio.dtype) for t in sums.values()]).tolist()))

    def frac(num: float, den: float, empty: float = 0.0) -> float:
        return num / den if den else empty

    metrics = {
        "mask_frac": frac(v["n_masked"], v["n_valid"]),
        "masked_kl_mean": frac(v["kl_masked"], v["n_masked"]),
        "seq_ratio_mean": frac(v["ratio_sum"], v["n_seq"], 1.0),
        "seq_ratio_min": v["ratio_min"],
        "seq_ratio_max": v["ratio_max"],
        "seq_clipfrac": frac(v["n_seq_clipped"], v["n_seq"]),
        "token_clipfrac": frac(v["n_clipped"], v["n_valid"]),
        "token_clipfrac_lower": frac(v["n_clipped_lower"], v["n_valid"]),
        "ppo_kl": frac(v["old_minus_new"], v["n_valid"]),
    }
    if "entropy" in v:
        metrics["entropy"] = frac(v["entropy"], v["n_valid"])
        if "old_entropy" in v:
            metrics["entropy_delta"] = frac(v["entropy"] - v["old_entropy"], v["n_valid"])
            metrics["surprisal_disagreement"] = frac(v["n_disagree"], v["n_valid"])
    return metrics
