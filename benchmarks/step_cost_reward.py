"""Reward for benchmarks/step_cost.py: a deterministic coin from the response text.

The step-cost model is random, so no answer is ever right; this reward still varies within every group (about
half the responses score 1), so every algorithm gets non-zero advantages and DAPO's dynamic sampling keeps
most groups, as in real training.
"""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    return float(sum(map(ord, solution_str)) % 2)
