"""Grading samples with the training reward (tepo_verl.reward), in parallel threads over its process pool."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from tqdm.auto import tqdm

from tepo_verl.evaluation.samples import Sample
from tepo_verl.reward import grade_response


def grade_samples(
    samples: Sequence[Sample],
    *,
    use_saved: bool = False,
    threads: int = 8,
    timeout_s: float = 10.0,
    isolation: str | None = None,
    progress: bool = True,
) -> int:
    """Set `acc` (1.0 or 0.0) and `pred` on every sample; returns how many gradings timed out.

    With `use_saved`, a sample that carries verl's saved `acc` keeps it (acc > 0 counts as correct) instead of
    being graded again; its saved `pred` is used for majority voting, and where verl saved none (its dumps carry
    `pred` only when the reward returns one) the answer is still extracted by grading, for the vote only.
    Samples without a saved `acc` are graded.
    """
    todo = []
    for sample in samples:
        if use_saved and sample.saved_acc is not None and sample.saved_pred:
            sample.acc, sample.pred = (1.0 if sample.saved_acc > 0 else 0.0), sample.saved_pred
        else:
            todo.append(sample)

    def grade(sample: Sample) -> bool:
        correct, pred, timed_out = grade_response(
            sample.response, sample.ground_truth, isolation=isolation, timeout_s=timeout_s
        )
        sample.acc, sample.pred = (1.0 if correct else 0.0), pred
        if use_saved and sample.saved_acc is not None:
            sample.acc = 1.0 if sample.saved_acc > 0 else 0.0
        return timed_out

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        timeouts = sum(tqdm(pool.map(grade, todo), total=len(todo), desc="grading", disable=not progress))
    return timeouts
