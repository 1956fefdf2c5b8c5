"""Sequence-level ("Markov") likelihood ratio and its straight-through token form (docs/algorithm.md, step 2)."""

from __future__ import annotations

import torch


def token_log_ratio(
    log_prob: torch.Tensor,  # (B, T)
    old_log_prob: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
) -> torch.Tensor:  # (B, T) l - l_old on valid tokens, exactly 0 on padding (even if padding holds NaN)
    return torch.where(response_mask.bool(), log_prob - old_log_prob, 0.0)


def sequence_log_ratio(
    token_ratio: torch.Tensor,  # (B, T) from token_log_ratio
    response_mask: torch.Tensor,  # (B, T)
) -> torch.Tensor:  # (B,) log s_i = (1/|o_i|) sum_t (l_it - l_old_it); 0 for an empty response
    return token_ratio.sum(dim=-1) / torch.count_nonzero(response_mask, dim=-1).clamp(min=1)


def prefix_log_ratio(
    token_ratio: torch.Tensor,  # (B, T) from token_log_ratio
    response_mask: torch.Tensor,  # (B, T)
) -> torch.Tensor:  # (B, T) geometric mean of the ratio over the valid tokens 1..t of o_i
    return token_ratio.cumsum(dim=-1) / response_mask.cumsum(dim=-1).clamp(min=1)


def straight_through_log_ratio(
    log_ratio: torch.Tensor,  # (B,) or (B, T): the sequence or prefix log-ratio
    log_prob: torch.Tensor,  # (B, T) current log-probs, with gradient
) -> torch.Tensor:  # (B, T) log s_it = sg[log s] + l_it - sg[l_it]
    """Value of the (sequence or prefix) log-ratio, gradient of the token's own log-prob (the autograd form that
    `tepo_policy_loss` differentiates in closed form)."""
    if log_ratio.dim() == 1:
        log_ratio = log_ratio.unsqueeze(-1)
    return log_ratio.detach() + log_prob - log_prob.detach()
