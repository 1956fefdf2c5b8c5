"""Benchmark scores from saved generations: avg@n, unbiased pass@k, maj@n (`python -m tepo_verl.evaluation`).

samples: reading verl's validation dumps or plain jsonl; grading: the training reward over them; metrics: the
per-problem estimators; report: the per-benchmark table, CSV and markdown.
"""

from tepo_verl.extras import require

require("reward", __name__)  # evaluation is in the 'reward' extra: one line naming it where it is missing

from tepo_verl.evaluation.cli import main  # noqa: E402
from tepo_verl.evaluation.metrics import majority_vote, mean_accuracy, pass_at_k  # noqa: E402
from tepo_verl.evaluation.report import build_table  # noqa: E402

__all__ = ["build_table", "main", "majority_vote", "mean_accuracy", "pass_at_k"]
