"""Which responses carry no group-relative signal (docs/algorithm.md, step 1).

The advantage itself is verl's GRPO estimator, which the `tepo` estimator calls (tepo_verl/verl_adapter/registry.py).
TEPO's one rule on top: a response whose group has no spread of rewards, because it is alone in its group or every
reward in the group is equal, gets A = 0 exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def without_signal(
    scores: torch.Tensor,  # (B,) scalar reward R_i of each response
    index: Sequence,  # (B,) group id (the prompt uid) of each response
) -> torch.Tensor:  # (B,) bool: True where the response's group has no spread of rewards
    """True for each response that is alone in its group or whose group's rewards are all equal."""
    if scores.dim() != 1 or len(index) != scores.shape[0]:
        raise ValueError(f"shape mismatch: scores {tuple(scores.shape)}, index of length {len(index)}")
    groups: dict = {}
    for position, group_id in enumerate(index):
        groups.setdefault(group_id, []).append(position)
    flags = torch.zeros(scores.shape[0], dtype=torch.bool, device=scores.device)  # (B,)
    for positions in groups.values():
        rows = torch.as_tensor(positions, device=scores.device)
        group_scores = scores[rows]  # (G,)
        if len(positions) < 2 or bool(group_scores.max() == group_scores.min()):
            flags[rows] = True
    return flags
