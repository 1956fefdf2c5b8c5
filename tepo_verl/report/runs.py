"""Read verl `file`-logger JSONL runs (one {"step": s, "data": {metric: value}} object per line)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

#: The metrics the report reads, as verl 0.9 (and tepo-verl's run_metrics hook) name them in the file logger.
REWARD = "critic/score/mean"
#: One entropy definition for every algorithm: the old (rollout) policy's entropy, token-mean over the step's
#: response tokens, logged by tepo_verl.verl_adapter.run_metrics. verl's own `actor/entropy` is not read: it is
#: averaged with each actor's loss_agg_mode, so it is a different quantity for GRPO/GSPO than for TEPO/DAPO.
ENTROPY = "tepo_verl/entropy_token_mean"
VERL_ENTROPY = "actor/entropy"
RESPONSES_GENERATED = "tepo_verl/responses_generated"
RESPONSE_LENGTH = "response_length/mean"
STEP_TIME = "timing_s/step"  # verl: one training step (generation, regeneration, log-probs, update), no validation
CHECKPOINT_TIME = "timing_s/save_checkpoint"  # verl: inside timing_s/step; subtracted (not the algorithm's work)
#: verl: the share of response tokens whose policy term is clipped (for sequence ratios, whole sequences clip)
CLIP_FRAC = "actor/pg_clipfrac"
MASK_FRAC = "actor/tepo/mask_frac"
MASKED_KL = "actor/tepo/masked_kl_mean"
#: TEPO: the share of positive-advantage tokens that the KL mask selects
MASK_FRAC_POSITIVE = "actor/tepo/mask_frac_positive"
#: TEPO: mean |d penalty / d l| over mean |d policy term / d l| on the masked tokens (the penalty's strength)
PENALTY_GRAD_RATIO = "actor/tepo/penalty_grad_ratio"
VAL_CORE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>acc|reward)/mean@\d+$")

_SEED_SUFFIX = re.compile(r"[-_.]?(seed|s)(?P<seed>\d+)$")


class RunError(Exception):
    """A run (file, folder or record) the report cannot read; `tepo-verl compare` prints it as one line."""


@dataclasses.dataclass
class Run:
    label: str  # the algorithm this run belongs to (runs with one label are seeds of it)
    path: Path
    metrics: dict[int, dict[str, float]]  # step -> merged metrics of that step

    @property
    def seed(self) -> int | None:
        """The seed number of the run's name (`grpo-seed3` -> 3), which pairs runs across algorithms."""
        match = _SEED_SUFFIX.search(run_name(self.path))
        return int(match["seed"]) if match else None

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


def run_name(path: Path) -> str:
    """The file name without .jsonl, or for the recipes' `<experiment>/metrics.jsonl` the folder name."""
    return path.parent.name if path.stem == "metrics" and path.parent.name else path.stem


def default_label(path: Path) -> str:
    """The run's name without a trailing seed suffix: `tepo-seed1.jsonl` -> `tepo`, and for the recipes'
    `<experiment>/metrics.jsonl` the folder name: `runs/cpu/grpo-seed2/metrics.jsonl` -> `grpo`."""
    name = run_name(path)
    return _SEED_SUFFIX.sub("", name) or name


def is_file_logger_run(path: Path) -> bool:
    """Whether the first record of a .jsonl file is a file-logger record ({"step": ..., "data": {...}}); verl's
    validation dumps ({"input", "output", ...}) and other jsonl files are not."""
    try:
        with open(path, encoding="utf-8") as handle:
            first = next((line for line in handle if line.strip()), "")
        record = json.loads(first)
    except (ValueError, OSError):  # UnicodeDecodeError is a ValueError
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
            raise RunError(f"no verl file-logger *.jsonl file under {path}")
        return [(label or None, f) for f in files]
    if not path.is_file():
        raise RunError(f"run file {path} does not exist (give a verl file-logger .jsonl or a folder)")
    return [(label or None, path)]


def load_run(path: Path, label: str | None = None) -> Run:
    metrics: dict[int, dict[str, float]] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    step, data = int(record["step"]), record["data"]
                    metrics.setdefault(step, {}).update(data)
                except (ValueError, KeyError, TypeError) as error:
                    raise RunError(f"{path}:{number}: not a verl file-logger record ({error})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RunError(f"cannot read run file {path}: {error}") from None
    if not metrics:
        raise RunError(f"{path}: no file-logger records")
    return Run(label=label or default_label(path), path=path, metrics=metrics)


def load_runs(specs: list[str]) -> list[Run]:
    runs = [load_run(path, label) for spec in specs for label, path in parse_run_spec(spec)]
    seen: dict[tuple[str, int], Path] = {}
    for run in runs:
        if run.seed is None:
            continue
        other = seen.setdefault((run.label, run.seed), run.path)
        if other != run.path:
            raise RunError(f"two runs of {run.label} with seed {run.seed}: {other} and {run.path} "
                           "(seeds pair runs across algorithms; give one of them another LABEL=)")
    return runs
