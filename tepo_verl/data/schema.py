"""verl's RL parquet schema, as verl's own examples write it and `verl.utils.dataset.rl_dataset.RLHFDataset`
reads it: data_source, prompt (chat list), ability, reward_model {style, ground_truth}, extra_info.

The reward loop takes `data_source`, `reward_model["ground_truth"]` and `extra_info` of each row to the reward
function. All files share one fixed Arrow schema (`FEATURES`), so verl can concatenate several train or val files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXTRA_INFO_FIELDS = ("split", "index", "question", "answer", "dataset", "template", "subject", "level", "source_id")
COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def features():
    """The `datasets.Features` of every file written here."""
    from datasets import Features, Value

    string = Value("string")
    extra = {name: string for name in EXTRA_INFO_FIELDS}
    extra["index"] = Value("int64")
    return Features(
        {
            "data_source": string,
            "prompt": [{"role": string, "content": string}],
            "ability": string,
            "reward_model": {"style": string, "ground_truth": string},
            "extra_info": extra,
        }
    )


def make_row(
    *,
    data_source: str,
    prompt: list[dict[str, str]],
    ground_truth: str,
    split: str,
    index: int,
    question: str,
    dataset: str,
    template: str,
    subject: str = "",
    level: str = "",
    source_id: str = "",
) -> dict[str, Any]:
    """One row in verl's schema."""
    return {
        "data_source": data_source,
        "prompt": prompt,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {
            "split": split,
            "index": int(index),
            "question": question,
            "answer": ground_truth,
            "dataset": dataset,
            "template": template,
            "subject": subject,
            "level": level,
            "source_id": source_id,
        },
    }


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows (from `make_row`) to a parquet file with the fixed schema; creates parent folders."""
    import datasets
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the table carries datasets' feature metadata, so datasets.load_dataset("parquet") gets the same features
    table = datasets.Dataset.from_list(rows, features=features()).data.table
    pq.write_table(table, str(path))
    return path


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a parquet file written by `write_parquet` (or any file in verl's schema)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"parquet file not found: {path}")
    return pq.read_table(path).to_pylist()


def row_question(row: dict[str, Any]) -> str:
    """The bare question of a row: extra_info.question, else the last user message of the prompt."""
    extra = row.get("extra_info") or {}
    if extra.get("question"):
        return str(extra["question"])
    users = [m.get("content", "") for m in row.get("prompt") or [] if m.get("role") == "user"]
    return str(users[-1]) if users else ""
