"""Reward for the tiny addition task: 1.0 when the response's final number equals the answer, else 0.0.

Use with verl: reward.custom_reward_function.path=<this file> reward.custom_reward_function.name=compute_score
Sparse and verifiable: only the final answer counts (the last integer in the response), no partial credit.
Standard library only, so verl's reward workers can load this file by path.
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"-?\d+")
_SPECIALS = re.compile(r"<\|[^|]*\|>")


def extract_answer(solution_str: str) -> str | None:
    """The last integer in the response (special tokens removed), or None."""
    numbers = _INTEGER.findall(_SPECIALS.sub(" ", solution_str or ""))
    return numbers[-1] if numbers else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    try:
        return 1.0 if int(answer) == int(str(ground_truth).strip()) else 0.0
    except ValueError:
        return 0.0
