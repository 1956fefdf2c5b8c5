"""Raw records -> rows in verl's schema, with a count of what was written, dropped (and why) and duplicated."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

from tepo_verl.data.contamination import normalize_question
from tepo_verl.data.records import answer_text, get_field, question_text
from tepo_verl.data.registry import DatasetSpec
from tepo_verl.data.schema import make_row
from tepo_verl.data.templates import get_template

#: Valid values of `dedup`: auto = drop repeated questions from training sets only (evaluation sets are left
#: as published and their duplicates only counted).
DEDUP_MODES = ("auto", "always", "never")


@dataclasses.dataclass
class ConversionReport:
    """What one conversion did. `dropped` maps a reason to a count."""

    dataset: str
    kind: str
    source: str
    read: int = 0
    written: int = 0
    dropped: Counter = dataclasses.field(default_factory=Counter)
    duplicates: int = 0
    duplicates_removed: int = 0
    conflicting_duplicates: int = 0
    contaminated: int = 0
    contaminated_removed: int = 0
    output: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["dropped"] = dict(self.dropped)
        return out


def _meta(record: dict[str, Any], *fields: str) -> str:
    for field in fields:
        value = get_field(record, field)
        if value is not None and str(value).strip():
            return str(value).strip()
    return ""


def convert_records(
    spec: DatasetSpec,
    records: Iterable[dict[str, Any]],
    *,
    template: str,
    source: str,
    dedup: str = "auto",
    split: str | None = None,
    progress: bool = True,
    total: int | None = None,
) -> tuple[list[dict[str, Any]], ConversionReport]:
    """Convert raw records of `spec` to verl rows.

    Rows without a question ("empty question") or a reference answer ("missing answer") are dropped. A question
    seen before (normalised text) is a duplicate: removed when `dedup` says so, else kept and counted; a
    duplicate whose answer differs from the first one's is also counted as conflicting. extra_info.index is the
    record's position in the source, so every row can be traced back.
    """
    if dedup not in DEDUP_MODES:
        raise ValueError(f"unknown dedup mode {dedup!r}; valid: {', '.join(DEDUP_MODES)}")
    chat = get_template(template)
    remove_duplicates = dedup == "always" or (dedup == "auto" and spec.kind == "train")
    split = split or ("train" if spec.kind == "train" else "test")
    report = ConversionReport(spec.name, spec.kind, source)
    first_answer: dict[str, str] = {}
    rows = []
    for position, record in enumerate(tqdm(records, desc=f"convert {spec.name}", total=total, disable=not progress)):
        report.read += 1
        question = question_text(record, spec)
        if not question:
            report.dropped["empty question"] += 1
            continue
        answer = answer_text(record, spec)
        if not answer:
            report.dropped["missing answer"] += 1
            continue
        key = normalize_question(question)
        if key in first_answer:
            report.duplicates += 1
            if first_answer[key] != answer:
                report.conflicting_duplicates += 1
            if remove_duplicates:
                report.duplicates_removed += 1
                continue
        else:
            first_answer[key] = answer
        rows.append(
            make_row(
                data_source=spec.data_source,
                prompt=chat.messages(question),
                ground_truth=answer,
                split=split,
                index=position,
                question=question,
                dataset=spec.name,
                template=template,
                subject=_meta(record, "subject", "type"),
                level=_meta(record, "level"),
                source_id=_meta(record, "unique_id", "id", "extra_info.index"),
            )
        )
    report.written = len(rows)
    return rows, report
