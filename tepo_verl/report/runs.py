"""Read verl `file`-logger JSONL runs (one {"step": s, "data": {metric: value}} object per line)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

#: The metrics the report reads, as verl 0.9 names them in its file logger.
REWARD = "critic/score/mean"
ENTROPY = "actor/entropy"
RESPONSE_LENGTH = "response_length/mean"
STEP_TIME = "timing_s/step"
MASK_FRAC = "actor/tepo/mask_frac"
VAL_CORE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>acc|reward)/mean@\d+$")

_SEED_SUFFIX = re.compile(r"[-_.]?(seed|s)\d+$")


@dataclasses.dataclass
class Run:
    label: str  # the algorithm this run belongs to (runs with one label are seeds of it)
    path: Path
    metrics: dict[int, dict[str, float]]  # step -> merged metrics of that step

    def series(self, name: str) -> list[tuple[int, float]]:
        return [(s, m[name]) for s, m in sorted(self.metrics.items()) if _finite(m.get(name))]

    def val_accuracy(self) -> list[tuple[int, float]]:
        """Mean over data sources of verl's core validation metric (acc if logged, else reward) per step."""
        out = []
        for step, m in sorted(self.metrics.items()):
            by_var: dict[str, list[float]] = {}
            for key, value in m.items():
                match = VAL_CORE.match(key)
                if match and _finite(value):
                    by_var.setdefault(match["var"], []).append(float(value))
            values = by_var.get("acc") or by_var.get("reward")
            if values:
                out.append((step, sum(values) / len(values)))
        return out


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def default_label(path: Path) -> str:
    """The run's name without a trailing seed suffix: `tepo-seed1.jsonl` -> `tepo`, and for the recipes'
    `<experiment>/metrics.jsonl` the folder name: `runs/cpu/grpo-seed2/metrics.jsonl` -> `grpo`."""
    name = path.parent.name if path.stem == "metrics" and path.parent.name else path.stem
    return _SEED_SUFFIX.sub("", name) or name


def is_file_logger_run(path: Path) -> bool:
    """Whether the first record of a .jsonl file is a file-logger record ({"step": ..., "data": {...}}); verl's
    validation dumps ({"input", "output", ...}) and other jsonl files are not."""
    with open(path, encoding="utf-8") as handle:
        first = next((line for line in handle if line.strip()), "")
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and "step" in record and isinstance(record.get("data"), dict)


def parse_run_spec(spec: str) -> list[tuple[str | None, Path]]:
    """`LABEL=PATH` or `PATH`; PATH is a .jsonl file, or a folder searched for file-logger *.jsonl files (other
    jsonl files there, such as validation dumps, are passed over)."""
    label, _, path_text = spec.rpartition("=") if "=" in spec else (None, "", spec)
    path = Path(path_text)
    if path.is_dir():
        files = [f for f in sorted(path.rglob("*.jsonl")) if is_file_logger_run(f)]
        if not files:
            raise FileNotFoundError(f"no verl file-logger *.jsonl file under {path}")
        return [(label or None, f) for f in files]
    if not path.is_file():
        raise FileNotFoundError(f"run file {path} does not exist (give a verl file-logger .jsonl or a folder)")
    return [(label or None, path)]


def load_run(path: Path, label: str | None = None) -> Run:
    metrics: dict[int, dict[str, float]] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step, data = int(record["step"]), record["data"]
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number}: not a verl file-logger record ({error})") from None
            metrics.setdefault(step, {}).update(data)
    return Run(label=label or default_label(path), path=path, metrics=metrics)


def load_runs(specs: list[str]) -> list[Run]:
    return [load_run(path, label) for spec in specs for label, path in parse_run_spec(spec)]
