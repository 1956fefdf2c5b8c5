"""The token-level KL mask M_it = [A_i > 0] and [entropy falling at (i, t)] (docs/algorithm.md, step 5).

`entropy_falling` decides the second factor; `tepo_policy_loss` combines it with A > 0 (zero on padding).
`MASK_RULES` is the one table of what each rule reads and which verl config key provides it: the loss, the config
checks and the error messages all read it.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class MaskInput:
    """An optional tensor a mask rule reads, and the verl setting that makes the trainer provide it."""

    meaning: str
    config_key: str  # dotted verl config key
    config_value: bool  # the value of `config_key` that provides the tensor


#: The optional tensors, by the name the loss takes them under.
MASK_INPUTS: dict[str, MaskInput] = {
    "entropy": MaskInput(
        "the current-policy entropy H, computed in the update pass over the full vocabulary, with gradient",
        "actor_rollout_ref.actor.calculate_entropy", True),
    "old_entropy": MaskInput(
        "the old-policy entropy H_old, stored by the v1 trainer's old-log-prob pass at no extra cost",
        "trainer.use_v1", True),
}


@dataclasses.dataclass(frozen=True)
class MaskRule:
    test: str  # the "entropy falling" test, as a formula
    inputs: tuple[str, ...]  # keys of MASK_INPUTS
    update_cost: str  # the extra work in the update pass


#: Every mask rule: its test, the tensors it reads, and what it costs in the update pass.
MASK_RULES: dict[str, MaskRule] = {
    "surprisal_old": MaskRule("l_old + H_old > 0", ("old_entropy",), "none (stored tensors)"),
    "surprisal": MaskRule("l + H > 0", ("entropy",), "the full-vocabulary entropy with gradient"),
    "old": MaskRule("H < H_old", ("entropy", "old_entropy"), "the full-vocabulary entropy with gradient"),
    "off": MaskRule("never", (), "none"),
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
) -> torch.Tensor:  # (B, T) bool
    """The rule's "entropy falling at (i, t)" test (MASK_RULES[rule].test), without gradient.

    surprisal: the sampled token is more likely than the policy's average (l > -H), so raising it lowers the
    entropy (first-order entropy dynamics of a softmax policy); surprisal_old is the same test on the stored
    old-policy tensors (equal to surprisal when current == old); old: the literal H < H_old, empty when
    current == old; off: never.
    """
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
