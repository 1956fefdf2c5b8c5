"""Maths reward on math-verify for verl, safe in threads (see `math_reward`).

Use it in verl with

    reward.custom_reward_function.path=pkg://tepo_verl.reward.math_reward
    reward.custom_reward_function.name=compute_score
"""

from tepo_verl.reward.math_reward import ISOLATIONS, compute_score, grade_response, normalize_ground_truths

__all__ = ["ISOLATIONS", "compute_score", "grade_response", "normalize_ground_truths"]
