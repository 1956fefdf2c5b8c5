"""Reading raw records: from the Hugging Face hub by name (`datasets.load_dataset`) or from local files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tepo_verl.data.registry import DatasetSpec

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


def load_hub(spec: DatasetSpec, split: str | None = None) -> list[dict[str, Any]]:
    """Download (or read from the HF cache) the data set's split. Needs network access or a warm cache."""
    import datasets

    dataset = datasets.load_dataset(spec.hub_id, spec.hub_config, split=split or spec.hub_split)
    return [dict(row) for row in dataset]


def load_local(path: str | Path) -> list[dict[str, Any]]:
    """Records of a .jsonl, .json (a list of objects, or JSON lines) or .parquet file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"unsupported data file {path}: use one of {', '.join(LOCAL_SUFFIXES)}")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return list(json.loads(text))
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON line ({error.msg})") from None
    return records


def find_local(spec: DatasetSpec, local_dir: str | Path) -> Path:
    """The file for `spec` in `local_dir`: its known offline name, else NAME.jsonl / NAME.json / NAME.parquet."""
    local_dir = Path(local_dir)
    candidates = list(spec.local_files) + [spec.name + suffix for suffix in LOCAL_SUFFIXES]
    for candidate in candidates:
        if (local_dir / candidate).is_file():
            return local_dir / candidate
    raise FileNotFoundError(f"no file for data set {spec.name!r} in {local_dir}; looked for {', '.join(candidates)}")
