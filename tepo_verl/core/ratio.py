"""Sequence-level ("Markov") likelihood ratio and its straight-through token form (spec "Reconstruction" 2)."""

from __future__ import annotations

import torch


def _masked_log_ratio(
    log_prob: torch.Tensor,  # (B, T)
    old_log_prob: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
) -> torch.Tensor:  # (B, T) l - l_old on valid tokens, exactly 0 on padding (even if padding holds NaN)
    return torch.where(response_mask.bool(), log_prob - old_log_prob, torch.zeros_like(log_prob))


def sequence_log_ratio(
    log_prob: torch.Tensor,  # (B, T)
    old_log_prob: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
) -> torch.Tensor:  # (B,) log s_i = (1/|o_i|) sum_t (l_it - l_old_it); 0 for an empty response
    lengths = response_mask.sum(dim=-1).clamp(min=1).to(log_prob.dtype)  # (B,)
    return _masked_log_ratio(log_prob, old_log_prob, response_mask).sum(dim=-1) / lengths


def prefix_log_ratio(
    log_prob: torch.Tensor,  # (B, T)
    old_log_prob: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
) -> torch.Tensor:  # (B, T) geometric mean of the ratio over the valid tokens 1..t of o_i
    counts = response_mask.to(log_prob.dtype).cumsum(dim=-1).clamp(min=1)  # (B, T)
    return _masked_log_ratio(log_prob, old_log_prob, response_mask).cumsum(dim=-1) / counts


def straight_through_log_ratio(
    log_ratio: torch.Tensor,  # (B,) or (B, T): the sequence or prefix log-ratio
    log_prob: torch.Tensor,  # (B, T) current log-probs, with gradient
) -> torch.Tensor:  # (B, T) log s_it = sg[log s] + l_it - sg[l_it]
    """Value of the (sequence or prefix) log-ratio, gradient of the token's own log-prob."""
    if log_ratio.dim() == 1:
        log_ratio = log_ratio.unsqueeze(-1)
    return log_ratio.detach() + log_prob - log_prob.detach()
