"""Benchmark scores from saved generations: avg@n, unbiased pass@k, maj@n (`python -m tepo_verl.evaluation`).

samples: reading verl's validation dumps or plain jsonl; grading: the training reward over them; metrics: the
per-problem estimators; report: the per-benchmark table, CSV and markdown.
"""

from tepo_verl.evaluation.cli import main
from tepo_verl.evaluation.metrics import majority_vote, mean_accuracy, pass_at_k
from tepo_verl.evaluation.report import build_table

__all__ = ["build_table", "main", "majority_vote", "mean_accuracy", "pass_at_k"]
