"""Maths reward on math-verify for verl, safe in threads (see `math_reward`).

Use it in verl with

    reward.custom_reward_function.path=pkg://tepo_verl.reward.math_reward
    reward.custom_reward_function.name=compute_score
"""

from tepo_verl.extras import require

# one line naming the extra where math-verify or pebble is missing (verl loads math_reward.py by path: its first
# import of tepo_verl.reward runs this too)
require("reward", __name__)

from tepo_verl.reward.math_reward import (  # noqa: E402
    ISOLATIONS,
    compute_score,
    grade_response,
    normalize_ground_truths,
)

__all__ = ["ISOLATIONS", "compute_score", "grade_response", "normalize_ground_truths"]
