"""Pure-torch TEPO math (docs/algorithm.md). Imports nothing from verl."""

from tepo_verl.core.advantage import without_signal
from tepo_verl.core.kl import KL_ESTIMATORS, kl_estimate
from tepo_verl.core.loss import TepoLossOutput, tepo_policy_loss, token_mean
from tepo_verl.core.mask import MASK_INPUTS, MASK_RULES, entropy_falling, required_inputs
from tepo_verl.core.options import TepoOptions
from tepo_verl.core.ratio import prefix_log_ratio, sequence_log_ratio, straight_through_log_ratio, token_log_ratio

__all__ = [
    "KL_ESTIMATORS",
    "MASK_INPUTS",
    "MASK_RULES",
    "TepoLossOutput",
    "TepoOptions",
    "entropy_falling",
    "kl_estimate",
    "prefix_log_ratio",
    "required_inputs",
    "sequence_log_ratio",
    "straight_through_log_ratio",
    "tepo_policy_loss",
    "token_log_ratio",
    "token_mean",
    "without_signal",
]
