"""The token-level KL mask M_it = [A_i > 0] and [entropy falling at (i, t)] (docs/algorithm.md, step 5).

`entropy_falling` decides the second factor; `tepo_policy_loss` combines it with A > 0 (zero on padding), or with
every valid token (`mask_advantage=any`), and optionally keeps only the top fraction by `entropy_decrease_score`
(`mask_top_frac`, `top_fraction`).
`MASK_RULES` is the one table of what each rule reads and which verl config key provides it: the loss, the config
checks and the error messages all read it.
"""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class MaskInput:
    """An optional tensor a mask rule reads, and the verl setting that makes the trainer provide it (None: every
    supported trainer provides it)."""

    meaning: str
    config_key: str | None  # dotted verl config key
    config_value: bool | None  # the value of `config_key` that provides the tensor


#: The optional tensors, by the name the loss takes them under.
MASK_INPUTS: dict[str, MaskInput] = {
    "entropy": MaskInput(
        "the current-policy entropy H, computed in the update pass over the full vocabulary",
        "actor_rollout_ref.actor.calculate_entropy", True),
    "old_entropy": MaskInput(
        "the old-policy entropy H_old, stored from the trainer's old-log-prob pass at no extra cost",
        None, None),
}


@dataclasses.dataclass(frozen=True)
class MaskRule:
    test: str  # the "entropy falling" test, as a formula
    inputs: tuple[str, ...]  # keys of MASK_INPUTS
    update_cost: str  # the extra work in the update pass
    policy: str | None  # whose l and H the test reads ("current", "old"); the top-fraction score reads the same


#: Every mask rule: its test, the tensors it reads, and what it costs in the update pass.
MASK_RULES: dict[str, MaskRule] = {
    "surprisal_old": MaskRule("l_old + H_old > 0", ("old_entropy",), "none (stored tensors)", "old"),
    "surprisal": MaskRule("l + H > 0", ("entropy",), "the full-vocabulary entropy (forward only)", "current"),
    "old": MaskRule("H < (1 - r) H_old", ("entropy", "old_entropy"), "the full-vocabulary entropy (forward only)",
                    "current"),
    "always": MaskRule("always", (), "none", None),
    "off": MaskRule("never", (), "none", None),
}


def required_inputs(rule: str) -> tuple[str, ...]:
    """Names of the optional tensors rule `rule` reads (keys of MASK_INPUTS)."""
    try:
        return MASK_RULES[rule].inputs
    except KeyError:
        raise ValueError(f"Unknown mask rule {rule!r}; valid: {', '.join(MASK_RULES)}") from None


def entropy_falling(
    rule: str,
    log_prob: torch.Tensor,  # (B, T) current log-probs l
    old_log_prob: torch.Tensor,  # (B, T) old log-probs l_old
    entropy: torch.Tensor | None = None,  # (B, T) current entropy H, or None
    old_entropy: torch.Tensor | None = None,  # (B, T) old entropy H_old, or None
    old_rtol: float = 0.0,  # r of the old rule
) -> torch.Tensor:  # (B, T) bool
    """The rule's "entropy falling at (i, t)" test (MASK_RULES[rule].test), without gradient.

    surprisal: the sampled token is more likely than the policy's average (l > -H), so raising it lowers the
    entropy (first-order entropy dynamics of a softmax policy); surprisal_old is the same test on the stored
    old-policy tensors (equal to surprisal when current == old); old: H < H_old, beyond a relative tolerance
    r for numerical noise (H < (1 - r) H_old), empty when current == old; always: every token (a control without
    the entropy test); off: never.
    """
    given = {"entropy": entropy, "old_entropy": old_entropy}
    missing = [name for name in required_inputs(rule) if given[name] is None]
    if missing:
        raise ValueError(f"mask rule {rule!r} needs {missing}, which were not given")
    with torch.no_grad():
        if rule == "old":
            return entropy < (1 - old_rtol) * old_entropy
        if rule == "surprisal":
            return log_prob + entropy > 0
        if rule == "surprisal_old":
            return old_log_prob + old_entropy > 0
        return torch.full_like(log_prob, rule == "always", dtype=torch.bool)


def entropy_decrease_score(
    rule: str,
    log_prob: torch.Tensor,  # (B, T) l
    old_log_prob: torch.Tensor,  # (B, T) l_old
    entropy: torch.Tensor | None,  # (B, T) H, or None
    old_entropy: torch.Tensor | None,  # (B, T) H_old, or None
    advantages: torch.Tensor,  # (B, T) A
) -> torch.Tensor:  # (B, T) p (l + H) A on the policy the rule reads
    """How much a policy-gradient step on token (i, t) lowers the entropy, to first order: the step raises z_k by
    about A (1 - p_k) and dH/dz_k = -p_k (l_k + H), so the decrease grows with p (l + H) A (the sign is the rule's
    test times the advantage's). Read on the tensors the rule reads (MASK_RULES[rule].policy)."""
    if MASK_RULES[rule].policy == "current":
        l, h = log_prob, entropy
    elif MASK_RULES[rule].policy == "old":
        l, h = old_log_prob, old_entropy
    else:
        raise ValueError(f"mask rule {rule!r} reads no entropy, so it has no entropy-decrease score")
    return torch.exp(l) * (l + h) * advantages


def top_fraction(
    mask: torch.Tensor,  # (B, T) bool, the candidates
    score: torch.Tensor,  # (B, T)
    fraction: float,
) -> torch.Tensor:  # (B, T) bool
    """The ceil(fraction * n) candidates with the highest score (n = number of candidates in this batch); ties go
    to the earlier position in row-major order."""
    n = int(mask.sum())
    k = math.ceil(fraction * n - 1e-9)  # 1e-9: 0.28 * 25 is 7.000000000000001 in floats, and means 7
    if k >= n:
        return mask
    flat = torch.where(mask, score, -torch.inf).flatten()  # (B*T,)
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[torch.sort(flat, descending=True, stable=True).indices[:k]] = True
    return keep.view_as(mask)
