"""Training prompts that also appear in an evaluation set (normalised exact text match)."""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from tepo_verl.data.schema import row_question

_LATEX_NOISE = re.compile(r"\\left|\\right|\\displaystyle|\\[,;:! ]|\$")
_NON_WORD = re.compile(r"[\s.,;:!?'\"`]+")


def normalize_question(text: str) -> str:
    """Case-, space-, punctuation- and LaTeX-spacing-insensitive form of a question (`\\dfrac` = `\\frac`)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _LATEX_NOISE.sub("", text)
    return _NON_WORD.sub("", text)


@dataclasses.dataclass(frozen=True)
class Overlap:
    """A training row whose question is also an evaluation row's question."""

    train_set: str
    train_index: int
    eval_set: str
    eval_index: int
    question: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def find_overlaps(
    train: Mapping[str, Sequence[dict[str, Any]]], evals: Mapping[str, Sequence[dict[str, Any]]]
) -> list[Overlap]:
    """Every (training row, evaluation row) pair with the same normalised question. Rows are in verl's schema;
    indices are positions in the given sequences."""
    eval_index: dict[str, list[tuple[str, int]]] = {}
    for eval_name, rows in evals.items():
        for position, row in enumerate(rows):
            key = normalize_question(row_question(row))
            if key:
                eval_index.setdefault(key, []).append((eval_name, position))
    overlaps = []
    for train_name, rows in train.items():
        for position, row in enumerate(rows):
            question = row_question(row)
            for eval_name, eval_position in eval_index.get(normalize_question(question), ()):
                overlaps.append(Overlap(train_name, position, eval_name, eval_position, question[:200]))
    return overlaps
