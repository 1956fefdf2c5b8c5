"""avg@k, unbiased pass@k and maj@k for one problem's samples."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), the chance that k of the n samples drawn
    without replacement hold at least one of the c correct ones. Computed as the stable product
    1 - prod_{i=n-c+1}^{n} (1 - k/i), with no huge binomials."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def mean_accuracy(correct: Sequence[float]) -> float:
    """avg@n: the mean correctness of the n samples (= pass@1)."""
    if not correct:
        raise ValueError("avg@n of no samples")
    return sum(correct) / len(correct)


def vote_key(pred: str) -> str:
    """Answers that are the same text apart from spacing vote together."""
    return "".join(pred.split())


def majority_vote(preds: Sequence[str], correct: Sequence[float]) -> float:
    """maj@n: the correctness of the most frequent extracted answer among the samples.

    Samples with no extracted answer ("") do not vote; with no answer at all the result is 0. Ties: the mean
    correctness of the tied answers, i.e. the expected score of a uniformly random tie-break (so the value does
    not depend on sample order). An answer's correctness is the mean over the samples that gave it (they agree
    when one grader graded them all).
    """
    if len(preds) != len(correct):
        raise ValueError(f"{len(preds)} predictions but {len(correct)} correctness values")
    votes: Counter[str] = Counter()
    grades: dict[str, list[float]] = defaultdict(list)
    for pred, ok in zip(preds, correct, strict=True):
        key = vote_key(pred or "")
        if key:
            votes[key] += 1
            grades[key].append(float(ok))
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [key for key, count in votes.items() if count == top]
    return sum(sum(grades[key]) / len(grades[key]) for key in tied) / len(tied)
