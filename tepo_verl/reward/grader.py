"""The grading function itself: math-verify with its signal-based timeouts switched off.

This module is what runs inside the reward worker processes (see `tepo_verl.reward.pool`), and also in-process
when isolation is "inline". It never uses `signal`, so it is safe in any thread; bounding its run time is the
caller's job (`pool.py` kills a worker that overruns).

math-verify's own timeouts (`parse(..., parsing_timeout=5)`, `verify(..., timeout_seconds=5)`) use
`signal.alarm`, which only works in the main thread of the main interpreter: in verl's reward workers (calls run
in a thread pool) they raised "signal only works in main thread", which math-verify then caught and scored as 0,
so every response got reward 0 (verl PR 5635, Math-Verify issues 50 and 55). Passing `None` turns them off.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

#: math-verify warns once per process that its timeouts are off; that is intended here, so keep it quiet.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_GOLD_TARGETS = (LatexExtractionConfig(),)
_GOLD_FALLBACK_TARGETS = (LatexExtractionConfig(), ExprExtractionConfig())
_PRED_TARGETS = (ExprExtractionConfig(), LatexExtractionConfig())


def _is_parsed(item: Any) -> bool:
    """True for a sympy object (math-verify returns sympy objects first, then the matched string)."""
    return not isinstance(item, str)


@lru_cache(maxsize=4096)
def parse_gold(ground_truth: str) -> tuple[Any, ...]:
    """Parse one reference answer. `27`, `\\frac{1}{2}`, `10\\%`, `\\text{(B)}` ... are read as if boxed.

    When the boxed LaTeX reading yields no sympy object (math-verify returns only the raw string, e.g. for
    `10\\%`), the unboxed text is also parsed with the plain-expression reader, so `10\\%` still grades `10`.
    """
    gold = parse("\\boxed{" + ground_truth + "}", _GOLD_TARGETS, parsing_timeout=None)
    if not any(_is_parsed(item) for item in gold):
        fallback = parse(ground_truth, _GOLD_FALLBACK_TARGETS, parsing_timeout=None)
        gold = list(gold) + [item for item in fallback if _is_parsed(item)]
    return tuple(gold)


#: The box commands whose content is a final answer (`\\fbox` is what some models write instead).
BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(solution: str) -> str | None:
    """The content of the LAST `\\boxed{...}` (or `\\fbox{...}`, or the `\\boxed 5` form) in a response.

    None when the response has no box at all; "" when the last box is empty or never closed (a truncated final
    answer is no answer, even if an earlier box was closed). Braces are matched with nesting, and escaped
    braces (`\\{`, `\\}`) are content, not delimiters. Linear in the response length.
    """
    start = max(solution.rfind(command) for command in BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in BOX_COMMANDS if solution.startswith(c, start))
    after = start + len(command)
    i = after
    while i < len(solution) and solution[i] == " ":
        i += 1
    if i >= len(solution) or solution[i] != "{":
        if i == after:  # `\\boxedx`, or the box is the very end of the text
            return ""
        word = solution[i:].split(None, 1)[0] if solution[i:].strip() else ""  # `\\boxed 5`: the next word
        return word.split("$", 1)[0]
    depth, j = 0, i
    while j < len(solution):
        char = solution[j]
        if char == "\\":
            j += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return solution[i + 1 : j]
        j += 1
    return ""


def extract_answer(solution: str) -> tuple[list[Any], str]:
    """Parse a model response: (math-verify's extraction list, the extracted answer as a string, "" if none).

    The maths-RL convention: the final answer is the content of the last `\\boxed{...}`; an earlier boxed
    draft that the response goes on to correct does not count, and neither does anything after the last box.
    Only a response with no box at all is read as a whole by math-verify (phrases such as "the final answer
    is", then the last expression), for templates that ask for `Answer: ...`. The string is math-verify's
    normalised LaTeX of the match (e.g. `0.5` becomes `\\frac{1}{2}`).
    """
    boxed = last_boxed(solution)
    if boxed is None:
        pred = parse(solution, _PRED_TARGETS, parsing_timeout=None)
    elif not boxed.strip():
        return [], ""
    else:
        pred = parse("\\boxed{" + boxed + "}", _GOLD_TARGETS, parsing_timeout=None)
    strings = [item for item in pred if isinstance(item, str)]
    return pred, (strings[-1] if strings else "")


def grade(solution: str, ground_truths: tuple[str, ...]) -> tuple[bool, str]:
    """(correct, extracted answer) for one response against one or more acceptable reference answers.

    Never raises for any string input: math-verify's own errors are caught by math-verify (its
    `raise_on_error=False` default) and anything else is caught here and graded as incorrect.
    """
    try:
        pred, pred_str = extract_answer(solution)
    except Exception:  # noqa: BLE001 - a grader must not raise on model output
        return False, ""
    if not pred:
        return False, ""
    for ground_truth in ground_truths:
        try:
            gold = parse_gold(ground_truth)
            if gold and verify(list(gold), pred, timeout_seconds=None):
                return True, pred_str
        except Exception:  # noqa: BLE001
            continue
    return False, pred_str
