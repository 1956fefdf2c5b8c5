"""Reading generations: verl's validation dumps or any jsonl of data_source, response and ground truth.

verl 0.9.1 writes `trainer.validation_data_dir/{step}.jsonl` (RayPPOTrainer._dump_generations) with one line per
sample: `input` (the decoded prompt), `output` (the decoded response), `gts` (the ground truth), `score`, `step`,
and every reward_extra_info key (`reward`, and from tepo_verl.reward `acc` and `pred`). It has no data_source:
give `--datasets` (the val parquet files, to map prompts back to their set) or `--data-source`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from tepo_verl.data.contamination import normalize_question
from tepo_verl.data.records import get_field
from tepo_verl.data.schema import read_parquet, row_question

RESPONSE_FIELDS = ("output", "response", "completion", "generation")
GROUND_TRUTH_FIELDS = ("gts", "ground_truth", "answer", "reward_model.ground_truth")
SOURCE_FIELDS = ("data_source", "benchmark")
PROMPT_FIELDS = ("input", "prompt", "problem", "question", "uid", "index")


@dataclasses.dataclass
class Sample:
    """One graded or to-be-graded response."""

    data_source: str
    prompt: str
    response: str
    ground_truth: Any
    saved_acc: float | None = None
    saved_pred: str | None = None
    acc: float | None = None
    pred: str = ""


def _first(record: dict[str, Any], fields: tuple[str, ...]) -> Any:
    for field in fields:
        value = get_field(record, field)
        if value is not None:
            return value
    return None


def resolve_files(paths: list[Path], step: int | None) -> list[Path]:
    """jsonl files to read: files as given; for a folder, `{step}.jsonl` (the newest step when `step` is None)."""
    files = []
    for path in paths:
        if path.is_dir():
            steps = {int(p.stem): p for p in path.glob("*.jsonl") if re.fullmatch(r"\d+", p.stem)}
            if step is not None:
                if step not in steps:
                    raise FileNotFoundError(f"no {step}.jsonl in {path}; steps there: {sorted(steps) or 'none'}")
                files.append(steps[step])
            elif steps:
                files.append(steps[max(steps)])
            else:
                found = sorted(path.glob("*.jsonl"))
                if not found:
                    raise FileNotFoundError(f"no .jsonl files in {path}")
                files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"generations file or folder not found: {path}")
    return files


def read_records(files: list[Path], step: int | None) -> list[dict[str, Any]]:
    """All JSON lines of the files; with several `step` values present, `step` must choose one."""
    records = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not a JSON line ({error.msg})") from None
    steps = sorted({r["step"] for r in records if "step" in r})
    if step is not None and steps:
        records = [r for r in records if r.get("step") == step]
        if not records:
            raise ValueError(f"no samples of step {step}; steps present: {steps}")
    elif len(steps) > 1:
        raise ValueError(f"samples of several steps {steps}: choose one with --step")
    return records


class SourceMap:
    """Finds the data set of a prompt from the val parquet files (its question inside the prompt text)."""

    def __init__(self, parquet_files: list[Path]):
        self.questions: list[tuple[str, str]] = []
        for path in parquet_files:
            for row in read_parquet(path):
                key = normalize_question(row_question(row))
                if key:
                    self.questions.append((key, str(row.get("data_source", path.stem))))
        self.questions.sort(key=lambda item: -len(item[0]))  # longest question first: the most specific match
        self._cache: dict[str, str | None] = {}

    def lookup(self, prompt: str) -> str | None:
        if prompt not in self._cache:
            text = normalize_question(prompt)
            self._cache[prompt] = next((source for key, source in self.questions if key in text), None)
        return self._cache[prompt]


def to_samples(
    records: list[dict[str, Any]], source_map: SourceMap | None = None, default_source: str | None = None
) -> list[Sample]:
    """Samples from records. The data set is the record's own field, else `source_map`'s match, else
    `default_source`; a record with none of these, no response field or no ground truth is an error."""
    samples = []
    for number, record in enumerate(records, start=1):
        response = _first(record, RESPONSE_FIELDS)
        if response is None:
            raise ValueError(f"sample {number} has no response field; expected one of {', '.join(RESPONSE_FIELDS)}")
        ground_truth = _first(record, GROUND_TRUTH_FIELDS)
        if ground_truth is None:
            raise ValueError(f"sample {number} has no ground truth; expected one of {', '.join(GROUND_TRUTH_FIELDS)}")
        prompt = _first(record, PROMPT_FIELDS)
        prompt = json.dumps(prompt, sort_keys=True) if isinstance(prompt, list | dict) else str(prompt or "")
        source = _first(record, SOURCE_FIELDS)
        if source is None and source_map is not None:
            source = source_map.lookup(prompt)
        if source is None:
            source = default_source
        if source is None:
            raise ValueError(
                f"sample {number} has no data_source and none could be inferred: pass --datasets (the val parquet "
                "files) or --data-source NAME"
            )
        saved_acc = record.get("acc")
        samples.append(
            Sample(
                data_source=str(source),
                prompt=prompt,
                response=str(response),
                ground_truth=ground_truth,
                saved_acc=None if saved_acc is None else float(saved_acc),
                saved_pred=None if record.get("pred") is None else str(record["pred"]),
            )
        )
    return samples
