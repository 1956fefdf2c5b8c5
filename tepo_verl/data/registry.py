"""The known data sets: where each lives on the Hugging Face hub, its field names, and its offline file name.

Hub ids and fields are those of the public copies most RL-for-maths work uses (checked against their loaders;
a hub copy may change: override with `--local NAME=PATH`). The offline names are the file names that
`--local-dir` looks for (jsonl with `problem` and `answer` fields).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """One data set. `question_fields`/`answer_fields` are tried in order; dotted names reach into dicts."""

    name: str
    kind: str  # "train" or "eval"
    hub_id: str
    hub_split: str
    description: str
    hub_config: str | None = None
    question_fields: tuple[str, ...] = ("problem", "question")
    answer_fields: tuple[str, ...] = ("answer",)
    local_files: tuple[str, ...] = ()
    #: raw fields copied into extra_info (as strings) when present
    meta_fields: tuple[str, ...] = ()

    @property
    def data_source(self) -> str:
        return self.name


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in [
        DatasetSpec(
            "dapo_math_17k", "train", "BytedTsinghua-SIA/DAPO-Math-17k", "train",
            "DAPO-Math-17k: prompt is a chat list already in DAPO's template, answer in reward_model.ground_truth; "
            "the hub parquet repeats each of its ~17.9k problems about 100 times (deduplicated here)",
            question_fields=("prompt", "problem", "question"),
            answer_fields=("reward_model.ground_truth", "answer", "solution"),
        ),
        DatasetSpec(
            "math_lighteval", "train", "DigitalLearningGmbH/MATH-lighteval", "train",
            "MATH (Hendrycks) train split, 7.5k: problem, solution (answer = its last \\boxed{}), level, type",
            hub_config="default", answer_fields=("answer", "solution"), meta_fields=("level", "type"),
        ),
        DatasetSpec(
            "gsm8k", "train", "openai/gsm8k", "train",
            "GSM8K train split, 7.5k: question, answer (reference = the number after '####')",
            hub_config="main", question_fields=("question", "problem"),
        ),
        DatasetSpec(
            "aime24", "eval", "HuggingFaceH4/aime_2024", "train", "AIME 2024 I and II, 30: problem, answer",
            local_files=("aime24.jsonl",),
        ),
        DatasetSpec(
            "aime25", "eval", "yentinglin/aime_2025", "train", "AIME 2025 I and II, 30: problem, answer",
            local_files=("aime25.jsonl",),
        ),
        DatasetSpec(
            "amc23", "eval", "math-ai/amc23", "test", "AMC 2023, 40: question, answer (floats such as 27.0)",
            question_fields=("question", "problem"), local_files=("amc23.jsonl",),
        ),
        DatasetSpec(
            "math500", "eval", "HuggingFaceH4/MATH-500", "test",
            "MATH-500, 500: problem, answer, subject, level, unique_id",
            local_files=("math500.jsonl",), meta_fields=("subject", "level", "unique_id"),
        ),
        DatasetSpec(
            "minerva", "eval", "math-ai/minervamath", "test", "Minerva-Math (MIT OCW), 272: question, answer",
            question_fields=("question", "problem"), local_files=("minerva.jsonl",),
        ),
        DatasetSpec(
            "olympiadbench", "eval", "Hothan/OlympiadBench", "train",
            "OlympiadBench English text-only open-ended maths, 675: question, final_answer (a list, joined with ', ')",
            hub_config="OE_TO_maths_en_COMP", question_fields=("question", "problem"),
            answer_fields=("final_answer", "answer"), local_files=("olympiadbench.jsonl",),
        ),
        DatasetSpec(
            "gsm8k_test", "eval", "openai/gsm8k", "test",
            "GSM8K test split, 1319: question, answer (reference = the number after '####')",
            hub_config="main", question_fields=("question", "problem"), local_files=("gsm8k_test.jsonl",),
        ),
    ]
}

#: Names that stand for several data sets on the command line.
GROUPS: dict[str, tuple[str, ...]] = {
    "eval": ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"),
    "train": ("dapo_math_17k", "math_lighteval", "gsm8k"),
}


def get_spec(name: str) -> DatasetSpec:
    """The data set called `name`; ValueError naming the valid ones otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(
            f"unknown data set {name!r}; valid: {', '.join(DATASETS)} (groups: {', '.join(GROUPS)})"
        ) from None


def expand_names(names: list[str]) -> list[str]:
    """Group names replaced by their members, duplicates removed, order kept; unknown names raise ValueError."""
    out: list[str] = []
    for name in names:
        for member in GROUPS.get(name, (name,)):
            get_spec(member)
            if member not in out:
                out.append(member)
    return out
