"""Group-relative advantage (docs/algorithm.md, step 1)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_relative_advantage(
    scores: torch.Tensor,  # (B,) scalar reward R_i of each response
    index: Sequence,  # (B,) group id (the prompt uid) of each response
    response_mask: torch.Tensor,  # (B, T) 1 on valid response tokens
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:  # (B, T) A_i broadcast to the valid tokens of o_i, 0 elsewhere
    """A_i = (R_i - mean_group(R)) / (std_group(R) + eps), broadcast over o_i's valid tokens.

    `std` is the unbiased (Bessel) sample std, as verl's GRPO. A group of one sample, or a group whose rewards
    are all equal, carries no signal and gets A = 0 exactly (never NaN). `norm_by_std=False` gives the
    Dr.GRPO form A_i = R_i - mean_group(R).
    """
    if scores.dim() != 1 or scores.shape[0] != response_mask.shape[0] or len(index) != scores.shape[0]:
        raise ValueError(
            f"shape mismatch: scores {tuple(scores.shape)}, index of length {len(index)}, "
            f"response_mask {tuple(response_mask.shape)}"
        )
    scores = scores.detach().to(torch.promote_types(scores.dtype, torch.float32))
    advantages = torch.zeros_like(scores)  # (B,)
    groups: dict = {}
    for position, group_id in enumerate(index):
        groups.setdefault(group_id, []).append(position)
    for positions in groups.values():
        rows = torch.as_tensor(positions, device=scores.device)
        group_scores = scores[rows]  # (G,)
        if len(positions) < 2 or bool(group_scores.max() == group_scores.min()):
            continue  # no signal: A stays exactly 0
        centred = group_scores - group_scores.mean()
        advantages[rows] = centred / (group_scores.std() + eps) if norm_by_std else centred
    return advantages.unsqueeze(-1) * response_mask.to(advantages.dtype)
