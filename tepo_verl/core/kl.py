"""Per-token KL estimators of the current policy against a target (spec "Reconstruction" 5).

Same definitions (and clamps) as verl's `kl_penalty_forward`, written here in pure torch so the core has no
verl import; a test checks they agree with verl's.
"""

from __future__ import annotations

import torch

#: Accepted names -> canonical estimator.
KL_ESTIMATORS: dict[str, str] = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}


def kl_estimate(
    log_prob: torch.Tensor,  # (B, T) current policy log-probs
    target_log_prob: torch.Tensor,  # (B, T) old-policy or reference log-probs
    estimator: str,
) -> torch.Tensor:  # (B, T) per-token estimate D_it
    """k1: l - l_t; abs: |l - l_t|; k2: (l - l_t)^2 / 2; k3: exp(l_t - l) - (l_t - l) - 1 (Schulman 2020)."""
    try:
        kind = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"Unknown KL estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}") from None
    diff = log_prob - target_log_prob
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "k2":
        return 0.5 * diff.square()
    reverse = torch.clamp(-diff, min=-20, max=20)  # log(pi_target / pi), clamped as verl does
    return torch.clamp(torch.exp(reverse) - reverse - 1, min=-10, max=10)


def kl_estimate_and_grad(
    log_prob: torch.Tensor,  # (B, T) current log-probs (no gradient needed)
    target_log_prob: torch.Tensor,  # (B, T)
    estimator: str,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, T) D_it, (B, T) dD_it / dl_it
    """`kl_estimate` and its derivative in closed form, with autograd's conventions at the clamps
    (torch.clamp passes the gradient where min <= x <= max; abs has derivative sign(x), 0 at 0)."""
    with torch.no_grad():
        value = kl_estimate(log_prob, target_log_prob, estimator)
        diff = log_prob - target_log_prob
        kind = KL_ESTIMATORS[estimator]
        if kind == "k1":
            return value, torch.ones_like(diff)
        if kind == "abs":
            return value, torch.sign(diff)
        if kind == "k2":
            return value, diff
        inner = -diff
        ratio = torch.exp(torch.clamp(inner, min=-20, max=20))
        raw = ratio - torch.clamp(inner, min=-20, max=20) - 1
        passes = (inner >= -20) & (inner <= 20) & (raw >= -10) & (raw <= 10)
        return value, torch.where(passes, 1 - ratio, torch.zeros_like(ratio))
