"""The token-level KL mask M_it = [A_i > 0] and [entropy falling at (i, t)] and [valid] (spec "Reconstruction" 5).

`entropy_falling` decides the middle factor; `tepo_policy_loss` combines it with A > 0 (zero on padding).

Entropy-falling rules (all evaluated without gradient):
- ``old``:           H_it < H^old_it  (literal reading; empty when current == old, e.g. a first on-policy update)
- ``surprisal``:     l_it + H_it > 0  (sampled token more likely than the policy's average: raising it lowers
                      entropy, first-order entropy dynamics; works on-policy)
- ``surprisal_old``: l^old_it + H^old_it > 0  (the same test on the stored old-policy quantities only; equals
                      ``surprisal`` when current == old; the fallback when the current entropy is not computed)
- ``off``:           never (the mask-off ablation)
"""

from __future__ import annotations

import torch

#: The tensors (beyond log-probs) each rule needs: current entropy, old entropy.
_RULE_INPUTS: dict[str, tuple[str, ...]] = {
    "old": ("entropy", "old_entropy"),
    "surprisal": ("entropy",),
    "surprisal_old": ("old_entropy",),
    "off": (),
}


def required_inputs(rule: str) -> tuple[str, ...]:
    """Names of the optional tensors rule `rule` needs ("entropy", "old_entropy")."""
    try:
        return _RULE_INPUTS[rule]
    except KeyError:
        raise ValueError(f"Unknown mask rule {rule!r}; valid: {', '.join(_RULE_INPUTS)}") from None


def entropy_falling(
    rule: str,
    log_prob: torch.Tensor,  # (B, T) current log-probs l
    old_log_prob: torch.Tensor,  # (B, T) old log-probs l_old
    entropy: torch.Tensor | None = None,  # (B, T) current entropy H, or None
    old_entropy: torch.Tensor | None = None,  # (B, T) old entropy H_old, or None
) -> torch.Tensor:  # (B, T) bool
    given = {"entropy": entropy, "old_entropy": old_entropy}
    missing = [name for name in required_inputs(rule) if given[name] is None]
    if missing:
        raise ValueError(f"mask rule {rule!r} needs {missing}, which were not given")
    with torch.no_grad():
        if rule == "old":
            return entropy < old_entropy
        if rule == "surprisal":
            return log_prob + entropy > 0
        if rule == "surprisal_old":
            return old_log_prob + old_entropy > 0
        return torch.zeros_like(log_prob, dtype=torch.bool)
