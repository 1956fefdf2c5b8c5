"""Rule-based maths reward on math-verify, in the signature of a verl custom reward function.

verl 0.9.1 calls a custom reward function (`reward.custom_reward_function.path/name`, loaded by
`verl.trainer.ppo.reward.get_custom_reward_fn`) from its reward-loop managers as

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)

in a thread of the asyncio loop's default executor (`loop.run_in_executor(None, ...)`), with
`reward.custom_reward_function.reward_kwargs` merged into the keyword arguments. A returned dict must carry
"score"; every other key becomes a per-sample `reward_extra_info` column (the keys must be the same for every
sample), "acc" is what verl's validation metrics average, and "pred" is what its maj@N vote counts.

The final answer is the content of the last `\\boxed{...}` (see `grader.extract_answer`); math-verify decides
whether it equals a reference answer.

Time bound: with isolation="process" (the default) a call returns within `timeout_s` (default 5 s) of wall
time whatever the response: the grading runs in a pebble worker process that is killed at the deadline, and a
timeout scores as incorrect. If worker processes cannot run at all, grading raises with the fix rather than
fall back to an unbounded grading. With isolation="inline" (opt-in) it runs in the calling thread, bounded only
by `max_response_chars`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from tepo_verl.reward.pool import GraderTimeout, shared_pool

logger = logging.getLogger(__name__)

#: Valid values of `isolation`.
ISOLATIONS = ("process", "inline")
#: Wall-clock limit per response (queueing included), seconds.
DEFAULT_TIMEOUT_S = 5.0
#: Only the last this-many characters of a response are graded (the final answer is at the end; the cap keeps
#: math-verify's regex scan and the inter-process copy bounded for runaway generations).
DEFAULT_MAX_RESPONSE_CHARS = 32_768


def normalize_ground_truths(ground_truth: Any) -> tuple[str, ...]:
    """Acceptable reference answers as strings: a string, a number, or a list/tuple/array of those."""
    if ground_truth is None:
        return ()
    if isinstance(ground_truth, str):
        return (ground_truth,) if ground_truth.strip() else ()
    if isinstance(ground_truth, bytes):
        return normalize_ground_truths(ground_truth.decode("utf-8", errors="replace"))
    if isinstance(ground_truth, int | float):
        value = float(ground_truth)
        return (str(int(value)) if value.is_integer() else repr(value),)
    if isinstance(ground_truth, dict):  # a whole reward_model dict passed by mistake
        return normalize_ground_truths(ground_truth.get("ground_truth"))
    if isinstance(ground_truth, Iterable):
        out: list[str] = []
        for item in ground_truth:
            out.extend(normalize_ground_truths(item))
        return tuple(out)
    return normalize_ground_truths(str(ground_truth))


def _as_text(solution_str: Any, max_chars: int) -> str:
    if solution_str is None:
        return ""
    if isinstance(solution_str, bytes):
        solution_str = solution_str.decode("utf-8", errors="replace")
    text = solution_str if isinstance(solution_str, str) else str(solution_str)
    if max_chars > 0 and len(text) > max_chars:
        text = text[-max_chars:]
    return text


def grade_response(
    solution_str: Any,
    ground_truth: Any,
    *,
    isolation: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_response_chars: int = DEFAULT_MAX_RESPONSE_CHARS,
) -> tuple[bool, str, bool]:
    """(correct, extracted answer, timed_out). Never raises on any response or reference.

    Raises ValueError only for an invalid `isolation` (a configuration error, not a model output).
    """
    isolation = isolation or os.environ.get("TEPO_REWARD_ISOLATION", "process")
    if isolation not in ISOLATIONS:
        raise ValueError(f"unknown reward isolation {isolation!r}; valid: {', '.join(ISOLATIONS)}")
    golds = normalize_ground_truths(ground_truth)
    text = _as_text(solution_str, max_response_chars)
    if not golds or not text.strip():
        return False, "", False
    if isolation == "inline":
        from tepo_verl.reward.grader import grade

        correct, pred = grade(text, golds)
        return correct, pred, False
    try:
        correct, pred = shared_pool().grade(text, golds, timeout_s)
        return correct, pred, False
    except GraderTimeout as error:
        logger.warning("math reward: %s; scored as incorrect", error)
        return False, "", True
    except (RuntimeError, OSError) as error:
        if "bootstrapping phase" in str(error):  # multiprocessing's error for a script without a main guard
            raise RuntimeError(
                "tepo_verl.reward: the grader pool starts worker processes, which re-import the main script; "
                "put the calling code under `if __name__ == '__main__':`, or pass isolation='inline' "
                "(or set TEPO_REWARD_ISOLATION=inline)"
            ) from error
        # No silent fallback: in-process grading has no time bound (a C-level sympy power holds the GIL), so it
        # is only ever the user's explicit choice.
        raise RuntimeError(
            f"tepo_verl.reward: the grader worker processes cannot run here ({error!r}); grading without them has "
            "no time bound, so choose it explicitly: isolation='inline' (or TEPO_REWARD_ISOLATION=inline)"
        ) from error


def compute_score(
    data_source: Any = None,
    solution_str: Any = None,
    ground_truth: Any = None,
    extra_info: dict | None = None,
    *,
    correct_score: float = 1.0,
    incorrect_score: float = 0.0,
    isolation: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_response_chars: int = DEFAULT_MAX_RESPONSE_CHARS,
    **kwargs: Any,
) -> dict[str, Any]:
    """verl custom reward: {"score": float, "acc": 1.0 or 0.0, "pred": extracted answer ("" if none)}.

    `data_source` and `extra_info` are accepted for verl's signature and ignored: every maths source is graded
    the same way. Extra keyword arguments that verl passes (e.g. `reward_router_address`) are ignored. Options
    (set them in `reward.custom_reward_function.reward_kwargs`): `correct_score`, `incorrect_score`,
    `isolation` ("process" or "inline", default from $TEPO_REWARD_ISOLATION or "process"), `timeout_s`,
    `max_response_chars`. A grading that times out scores `incorrect_score`.
    """
    correct, pred, _ = grade_response(
        solution_str,
        ground_truth,
        isolation=isolation,
        timeout_s=timeout_s,
        max_response_chars=max_response_chars,
    )
    return {"score": float(correct_score if correct else incorrect_score), "acc": 1.0 if correct else 0.0, "pred": pred}
