"""Read verl `file`-logger JSONL runs (one {"step": s, "data": {metric: value}} object per line).

A run that resumed from a checkpoint has several segments: verl's file logger truncates its file when it opens it,
so before a resumed run starts the recipes move the file aside (`keep_segments`): `metrics.jsonl` is the latest
segment, `metrics.segment-1.jsonl`, `metrics.segment-2.jsonl`, ... the earlier ones in order. Reading a run reads
its segments as one run ordered by step; where a step appears in two segments, the later segment's value of each
metric wins (a resumed run recomputes the steps after its checkpoint, and validates again at the checkpoint's step).

Every reader takes a metrics file plain or gzip-compressed (`metrics.jsonl.gz`, as the committed study runs are
kept): `open_metrics` opens either, and `metrics_file` finds the one a run folder holds.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import math
import re
import zlib
from pathlib import Path
from typing import TextIO

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
#: TEPO: the penalty's share of the |gradient| on the masked tokens, 0 to 1 (the penalty's strength)
PENALTY_GRAD_SHARE = "actor/tepo/penalty_grad_share"
#: What runs logged before PENALTY_GRAD_SHARE: penalty over policy term, infinite on a step (its value the mean over
#: micro-batches then) with a micro-batch whose masked tokens were all clipped. Read for those runs only.
OLDER_PENALTY_GRAD_RATIO = "actor/tepo/penalty_grad_ratio"
#: verl's dynamic sampling (DAPO's group filter) logs these; a run with them trained on a filtered batch: the groups
#: whose rewards differ. Its batch metrics (entropy, response length, training reward) describe those groups only.
FILTER_GROUPS_PREFIX = "training/filter_groups/"
VAL_CORE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>acc|reward)/mean@\d+$")

#: A run folder's metrics file as verl's file logger writes it (recipes/common.sh and recipes/cpu.sh point
#: VERL_FILE_LOGGER_PATH there), and the gzip suffix of its compressed copy (`metrics.jsonl.gz`).
METRICS_NAME = "metrics.jsonl"
GZIP_SUFFIX = ".gz"
#: What reading a metrics file may raise besides a bad record: a missing or unreadable file, a corrupt or cut-off
#: gzip stream (gzip.BadGzipFile is an OSError; a stream that ends early raises EOFError), bytes that are not UTF-8.
READ_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError)

_SEED_SUFFIX = re.compile(r"[-_.]?(seed|s)(?P<seed>\d+)$")
_SEGMENT = re.compile(r"^(?P<base>.+)\.segment-(?P<number>[1-9]\d*)\.jsonl(?P<gz>\.gz)?$")


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

    @property
    def filtered_batch(self) -> bool:
        """Whether the run's training batch was filtered (dynamic sampling): its metrics name the filter."""
        return any(name.startswith(FILTER_GROUPS_PREFIX) for m in self.metrics.values() for name in m)

    def penalty_strength(self) -> list[tuple[int, float]]:
        """PENALTY_GRAD_SHARE per step; for a run that predates it, the older ratio on its finite steps."""
        return self.series(PENALTY_GRAD_SHARE) or self.series(OLDER_PENALTY_GRAD_RATIO)

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


def is_compressed(path: Path) -> bool:
    return path.name.endswith(GZIP_SUFFIX)


def open_metrics(path: Path) -> TextIO:
    """A file-logger JSONL opened for reading as text: gzip-compressed when its name ends in .gz, else plain."""
    return gzip.open(path, "rt", encoding="utf-8") if is_compressed(path) else open(path, encoding="utf-8")


def metrics_file(folder: Path) -> Path:
    """The metrics file of a run folder: `metrics.jsonl` (as verl's file logger writes it) or `metrics.jsonl.gz`
    (as a study keeps a finished run); where the folder holds neither, the plain name, which does not exist."""
    plain, compressed = folder / METRICS_NAME, folder / (METRICS_NAME + GZIP_SUFFIX)
    if plain.is_file() and compressed.is_file():
        raise RunError(f"run folder {folder} holds both {plain.name} and {compressed.name}: keep one")
    return compressed if compressed.is_file() else plain


def _stem(path: Path) -> str:
    """The file name without .jsonl or .jsonl.gz (any other name without its last suffix)."""
    name = path.name.removesuffix(GZIP_SUFFIX) if is_compressed(path) else path.name
    return name.removesuffix(".jsonl") if name.endswith(".jsonl") else Path(name).stem


def run_name(path: Path) -> str:
    """The file name without .jsonl (or .jsonl.gz), or for the recipes' `<experiment>/metrics.jsonl` the folder
    name."""
    stem = _stem(path)
    return path.parent.name if stem == "metrics" and path.parent.name else stem


def default_label(path: Path) -> str:
    """The run's name without a trailing seed suffix: `tepo-seed1.jsonl` -> `tepo`, and for the recipes'
    `<experiment>/metrics.jsonl` the folder name: `runs/cpu/grpo-seed2/metrics.jsonl` -> `grpo`."""
    name = run_name(path)
    return _SEED_SUFFIX.sub("", name) or name


def is_file_logger_run(path: Path) -> bool:
    """Whether the first record of a .jsonl (or .jsonl.gz) file is a file-logger record ({"step": ..., "data":
    {...}}); verl's validation dumps ({"input", "output", ...}) and other jsonl files are not."""
    try:
        with open_metrics(path) as handle:
            first = next((line for line in handle if line.strip()), "")
        record = json.loads(first)
    except (ValueError, *READ_ERRORS):
        return False
    return isinstance(record, dict) and "step" in record and isinstance(record.get("data"), dict)


def base_of_segment(path: Path) -> Path | None:
    """`metrics.segment-2.jsonl` -> `metrics.jsonl` (the run it belongs to: its latest segment, plain or
    compressed, whichever exists; where neither does, the segment's own compression); None for any other file."""
    match = _SEGMENT.match(path.name)
    if not match:
        return None
    plain = path.with_name(f"{match['base']}.jsonl")
    compressed = plain.with_name(plain.name + GZIP_SUFFIX)
    if plain.is_file():
        return plain
    return compressed if compressed.is_file() or match["gz"] else plain


def segments(path: Path) -> list[Path]:
    """The files of the run whose latest segment is `path`, earliest first (`path` last, where it exists). Each
    segment may be plain or compressed; one segment number in both forms is an error."""
    numbered: dict[int, Path] = {}
    for candidate in sorted(path.parent.glob(glob.escape(_stem(path)) + ".segment-*.jsonl*")):
        match = _SEGMENT.match(candidate.name)
        if match and match["base"] == _stem(path):
            other = numbered.setdefault(int(match["number"]), candidate)
            if other != candidate:
                raise RunError(f"segment {match['number']} of run {path} is there twice: {other.name} and "
                               f"{candidate.name}: keep one")
    return [numbered[n] for n in sorted(numbered)] + ([path] if path.is_file() else [])


def keep_segments(metrics: Path, resuming: bool) -> str | None:
    """Before a run opens `metrics` (verl's file logger truncates it): when the run resumes from a checkpoint, move
    the file aside as the next segment; when it starts afresh, the earlier segments belong to the run it replaces,
    so remove them. Returns what was done, as a line to print, or None."""
    earlier = segments(metrics)[:-1] if metrics.is_file() else segments(metrics)
    if not resuming:
        for segment in earlier:
            segment.unlink()
        return f"fresh start: removed {len(earlier)} earlier segment(s) of the run it replaces" if earlier else None
    if not metrics.is_file() or metrics.stat().st_size == 0:
        return None
    numbers = [int(_SEGMENT.match(f.name)["number"]) for f in earlier]
    target = metrics.with_name(f"{_stem(metrics)}.segment-{max(numbers, default=0) + 1}.jsonl")
    metrics.rename(target)
    return f"resuming: kept the metrics so far as {target.name} (tepo-verl compare reads the segments as one run)"


def parse_run_spec(spec: str) -> list[tuple[str | None, Path]]:
    """`LABEL=PATH` or `PATH`; PATH is a .jsonl or .jsonl.gz file, or a folder searched for file-logger files of
    either kind (other jsonl files there, such as validation dumps, are passed over). A run's earlier segments are
    not runs of their own: they are read with it."""
    label, _, path_text = spec.rpartition("=") if "=" in spec else (None, "", spec)
    path = Path(path_text)
    if path.is_dir():
        candidates = sorted({*path.rglob("*.jsonl"), *path.rglob("*.jsonl" + GZIP_SUFFIX)})
        found = [f for f in candidates if is_file_logger_run(f)]
        files = sorted({base_of_segment(f) or f for f in found})
        if not files:
            raise RunError(f"no verl file-logger *.jsonl or *.jsonl.gz file under {path}")
        return [(label or None, f) for f in files]
    path = base_of_segment(path) or path
    if not segments(path):
        raise RunError(f"run file {path} does not exist (give a verl file-logger .jsonl, .jsonl.gz or a folder)")
    return [(label or None, path)]


def load_run(path: Path, label: str | None = None) -> Run:
    """The run whose latest segment is `path`, with every earlier segment (`segments`): one record per step, the
    later segment's value winning for each metric."""
    metrics: dict[int, dict[str, float]] = {}
    files = segments(path)
    if not files:
        raise RunError(f"cannot read run file {path}: it does not exist")
    for segment in files:
        try:
            with open_metrics(segment) as handle:
                for number, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                        step, data = int(record["step"]), record["data"]
                        metrics.setdefault(step, {}).update(data)
                    except (ValueError, KeyError, TypeError) as error:
                        raise RunError(f"{segment}:{number}: not a verl file-logger record ({error})") from None
        except READ_ERRORS as error:
            raise RunError(f"cannot read run file {segment}: {error}") from None
    metrics = dict(sorted(metrics.items()))
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


def override_value(overrides: list[str], key: str) -> str | None:
    """The value of the last `key=V` (or +key=V / ++key=V) among Hydra overrides, as Hydra lets the last one win."""
    values = [arg.lstrip("+").split("=", 1)[1] for arg in overrides if arg.lstrip("+").split("=", 1)[0] == key
              and "=" in arg]
    return values[-1].strip("'\"") if values else None


def will_resume(checkpoints: Path, overrides: list[str]) -> bool:
    """Whether verl's trainer, given these overrides, resumes from a checkpoint (trainer.resume_mode, default auto:
    the latest checkpoint under trainer.default_local_dir, found as verl finds it)."""
    mode = override_value(overrides, "trainer.resume_mode") or "auto"
    if mode == "disable":
        return False
    if mode == "resume_path":
        return override_value(overrides, "trainer.resume_from_path") not in (None, "null")
    import contextlib
    import io

    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    folder = override_value(overrides, "trainer.default_local_dir") or str(checkpoints)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints a line when there is no checkpoint
        return find_latest_ckpt_path(folder) is not None


def main(argv: list[str] | None = None) -> int:
    """`python -m tepo_verl.report.runs keep-segments METRICS CHECKPOINTS [VERL OVERRIDES...]`: what the recipes run
    before verl's trainer opens METRICS (see keep_segments)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[0] != "keep-segments":
        print("usage: python -m tepo_verl.report.runs keep-segments METRICS CHECKPOINTS [VERL OVERRIDES...]",
              file=sys.stderr)
        return 2
    metrics, checkpoints, overrides = Path(args[1]), Path(args[2]), args[3:]
    if not segments(metrics):  # a first start: nothing to keep or remove, so no need to ask verl about checkpoints
        return 0
    message = keep_segments(metrics, will_resume(checkpoints, overrides))
    if message:
        print(f"[tepo-verl] {metrics}: {message}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
