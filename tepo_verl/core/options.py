"""Every TEPO option, its default and why (docs/algorithm.md; a test checks the README "Options" table against it).

The paper's body is unavailable, so each uncertain choice of the reconstruction is a named option here.
`TepoOptions.from_mapping` rejects unknown names and values with an error that lists the valid ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from tepo_verl.core.mask import MASK_RULES

#: Valid values of each choice option. The first entry of each tuple is NOT necessarily the default.
CHOICES: dict[str, tuple[str, ...]] = {
    # Step 2: geometric-mean likelihood ratio over the whole response, or over the prefix 1..t.
    "ratio_mode": ("sequence", "prefix"),
    # Step 5: how "entropy decreasing at (i, t)" is decided.
    "mask_rule": tuple(MASK_RULES),
    # Step 5: which tokens the mask may select: positive-advantage ones (TEPO) or every valid token (a control).
    "mask_advantage": ("positive", "any"),
    # What to do when the mask rule's inputs are missing: "none" = raise; otherwise the rule to run instead.
    "mask_fallback": ("none", "surprisal_old", "off"),
    # Step 5: on masked tokens, add beta * D ("penalty") or drop the policy term ("drop").
    "mask_action": ("penalty", "drop"),
    # Step 5: the KL target, the old (sampling) policy or the reference model.
    "kl_target": ("old", "ref"),
    # Step 5: per-token KL estimator (verl's names and the k-names are both accepted).
    "kl_estimator": ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"),
}

#: Short meaning of every option, for error messages and docs.
MEANINGS: dict[str, str] = {
    "ratio_mode": "sequence: one geometric-mean ratio per response; prefix: geometric mean over tokens 1..t",
    "mask_rule": "entropy-falling test of the KL mask: "
    + ", ".join(f"{name} ({rule.test})" for name, rule in MASK_RULES.items()),
    "mask_advantage": "positive: the mask selects positive-advantage tokens only (TEPO); any: every valid token "
    "(a control, not the paper's)",
    "mask_old_rtol": "relative tolerance of the old rule: it masks a token when H < (1 - mask_old_rtol) H_old "
    "(0 <= r < 1; by default 2^-7, one bf16 unit in the last place)",
    "mask_top_frac": "keep only this fraction (0 < f <= 1) of the tokens the mask selects in each micro-batch, those "
    "with the largest p (l + H) A (a control, not the paper's; 1 = all)",
    "mask_fallback": "rule used when the mask rule's inputs are missing; none = raise an error",
    "mask_action": "penalty: add kl_coef*D on masked tokens; drop: remove the policy term on masked tokens",
    "kl_target": "old: KL of the current policy to the old policy; ref: to the reference model",
    "kl_estimator": "per-token KL estimator: k1/kl, abs, k2/mse, k3/low_var_kl",
    "kl_coef": "beta, the weight of the per-token KL penalty on masked tokens (>= 0)",
    "log_ratio_clamp": "upper clamp on the token log-ratio before exp, as verl's GSPO (10.0)",
}


@dataclasses.dataclass(frozen=True)
class TepoOptions:
    """The TEPO loss options. Defaults are the reconstruction's reasoned choices (docs/algorithm.md)."""

    ratio_mode: str = "sequence"
    mask_rule: str = "surprisal_old"
    mask_advantage: str = "positive"
    mask_top_frac: float = 1.0
    mask_old_rtol: float = 2.0**-7
    mask_fallback: str = "none"
    mask_action: str = "penalty"
    kl_target: str = "old"
    kl_estimator: str = "low_var_kl"
    kl_coef: float = 1.0
    log_ratio_clamp: float = 10.0

    def __post_init__(self) -> None:
        for name, valid in CHOICES.items():
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(
                    f"TEPO option {name}={value!r} is not valid; valid values: {', '.join(valid)} "
                    f"({MEANINGS[name]})"
                )
        if not isinstance(self.kl_coef, int | float) or not math.isfinite(self.kl_coef) or self.kl_coef < 0:
            raise ValueError(f"TEPO option kl_coef={self.kl_coef!r} must be a finite number >= 0")
        if isinstance(self.mask_top_frac, bool) or not isinstance(self.mask_top_frac, int | float) or not (
                0 < self.mask_top_frac <= 1):
            raise ValueError(f"TEPO option mask_top_frac={self.mask_top_frac!r} must be a number in (0, 1] "
                             f"({MEANINGS['mask_top_frac']})")
        if isinstance(self.mask_old_rtol, bool) or not isinstance(self.mask_old_rtol, int | float) or not (
                0 <= self.mask_old_rtol < 1):
            raise ValueError(f"TEPO option mask_old_rtol={self.mask_old_rtol!r} must be a number in [0, 1) "
                             f"({MEANINGS['mask_old_rtol']})")
        if self.mask_top_frac < 1 and MASK_RULES[self.mask_rule].policy is None:
            scored = [name for name, rule in MASK_RULES.items() if rule.policy is not None]
            raise ValueError(f"TEPO option mask_top_frac={self.mask_top_frac!r} ranks tokens by p (l + H) A, which "
                             f"mask_rule={self.mask_rule} does not read; valid mask rules with it: {', '.join(scored)}")
        if not isinstance(self.log_ratio_clamp, int | float) or not self.log_ratio_clamp > 0:
            raise ValueError(f"TEPO option log_ratio_clamp={self.log_ratio_clamp!r} must be a number > 0")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> TepoOptions:
        """Build options from a dict/DictConfig, rejecting unknown names with the list of valid ones."""
        if values is None:
            return cls()
        if isinstance(values, TepoOptions):
            return values
        unknown = sorted(set(values) - set(cls.field_names()) - {"_target_"})
        if unknown:
            raise ValueError(
                f"Unknown TEPO option(s) {unknown}; valid options: {', '.join(cls.field_names())}"
            )
        return cls(**{k: v for k, v in values.items() if k != "_target_"})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
