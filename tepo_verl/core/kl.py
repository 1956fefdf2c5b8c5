"""Per-token KL estimators of the current policy against a target (docs/algorithm.md, step 5).

Same definitions (and clamps) as verl's `kl_penalty`, written here in pure torch so the core has no verl import;
tests/test_verl_integration.py checks that they agree with verl's, value and gradient.
"""

from __future__ import annotations

import torch

#: Accepted names -> canonical estimator.
KL_ESTIMATORS: dict[str, str] = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3",
                                  "low_var_kl": "k3"}


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

