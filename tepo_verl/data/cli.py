"""`python -m tepo_verl.data` (or `tepo-verl data`): build verl parquet files for maths RL.

    python -m tepo_verl.data list
    python -m tepo_verl.data convert dapo_math_17k eval --out-dir data/
    python -m tepo_verl.data convert eval gsm8k_test --local-dir DIR --offline --out-dir data/   # offline files
    python -m tepo_verl.data contamination --train data/dapo_math_17k.parquet --eval data/aime24.parquet ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tepo_verl.data.contamination import find_overlaps
from tepo_verl.data.convert import DEDUP_MODES, ConversionReport, convert_records
from tepo_verl.data.registry import DATASETS, GROUPS, expand_names, get_spec
from tepo_verl.data.schema import read_parquet, write_parquet
from tepo_verl.data.sources import find_local, load_hub, load_local
from tepo_verl.data.templates import DEFAULT_TEMPLATE, TEMPLATES

REPORT_NAME = "conversion_report.json"


def _parse_local(pairs: list[str]) -> dict[str, Path]:
    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--local takes NAME=PATH, got {pair!r}")
        get_spec(name)
        out[name] = Path(path)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tepo_verl.data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="list the known data sets, groups and prompt templates")

    convert = sub.add_parser("convert", help="convert data sets to verl parquet files")
    convert.add_argument("datasets", nargs="+", help=f"data set names or groups ({', '.join(GROUPS)})")
    convert.add_argument("--out-dir", required=True, type=Path, help="folder for NAME.parquet and the report")
    convert.add_argument("--template", default=DEFAULT_TEMPLATE, help=f"prompt template: {', '.join(TEMPLATES)}")
    convert.add_argument("--local-dir", type=Path, help="read NAME's offline file from here when it exists")
    convert.add_argument("--local", action="append", default=[], metavar="NAME=PATH", help="read NAME from PATH")
    convert.add_argument("--offline", action="store_true", help="never download: a set without a local file fails")
    convert.add_argument("--split", help="hub split to read instead of each set's default")
    convert.add_argument("--limit", type=int, help="convert only the first N records of each set")
    convert.add_argument("--dedup", default="auto", choices=DEDUP_MODES,
                         help="drop repeated questions (auto: train sets)")
    convert.add_argument("--drop-contaminated", action="store_true", help="remove training rows found in an eval set")
    convert.add_argument("--combine-eval", type=Path, help="also write all converted eval sets to this one parquet")
    convert.add_argument("--no-progress", action="store_true", help="no progress bars")

    contamination = sub.add_parser("contamination", help="report training rows whose question is in an eval set")
    contamination.add_argument("--train", nargs="+", required=True, type=Path, help="training parquet files")
    contamination.add_argument("--eval", nargs="+", required=True, type=Path, help="evaluation parquet files")
    contamination.add_argument("--report", type=Path, help="write the overlaps as JSON here")
    return parser


def _load(name: str, args: argparse.Namespace, local: dict[str, Path]) -> tuple[list[dict], str]:
    spec = get_spec(name)
    path = local.get(name)
    if path is None and args.local_dir is not None:
        try:
            path = find_local(spec, args.local_dir)
        except FileNotFoundError:
            if args.offline:
                raise
    if path is not None:
        return load_local(path), str(path)
    if args.offline:
        raise FileNotFoundError(f"data set {name!r}: --offline and no --local/--local-dir file given")
    return load_hub(spec, args.split), f"hf://{spec.hub_id}" + (f"/{spec.hub_config}" if spec.hub_config else "")


def _print_summary(reports: list[ConversionReport]) -> None:
    header = f"{'data set':<16}{'kind':<7}{'read':>8}{'written':>9}{'dup':>7}{'dup-rm':>8}{'contam':>8}  dropped"
    print(header)
    print("-" * len(header))
    for r in reports:
        dropped = ", ".join(f"{why}: {n}" for why, n in sorted(r.dropped.items())) or "-"
        print(
            f"{r.dataset:<16}{r.kind:<7}{r.read:>8}{r.written:>9}{r.duplicates:>7}{r.duplicates_removed:>8}"
            f"{r.contaminated:>8}  {dropped}"
        )


def run_convert(args: argparse.Namespace) -> int:
    if args.template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {args.template!r}; valid: {', '.join(TEMPLATES)}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.out_dir.exists() and not args.out_dir.is_dir():
        raise ValueError(f"--out-dir {args.out_dir} is a file, not a folder")
    if args.local_dir is not None and not args.local_dir.is_dir():
        raise ValueError(f"--local-dir {args.local_dir} is not a folder")
    names = expand_names(args.datasets)
    local = _parse_local(args.local)
    converted: dict[str, list[dict]] = {}
    reports: dict[str, ConversionReport] = {}
    for name in names:
        records, source = _load(name, args, local)
        if args.limit is not None:
            records = records[: args.limit]
        rows, report = convert_records(
            get_spec(name), records, template=args.template, source=source, dedup=args.dedup,
            split=None, progress=not args.no_progress, total=len(records),
        )
        converted[name], reports[name] = rows, report

    train = {n: rows for n, rows in converted.items() if DATASETS[n].kind == "train"}
    evals = {n: rows for n, rows in converted.items() if DATASETS[n].kind == "eval"}
    overlaps = find_overlaps(train, evals)
    for name in train:
        hit_positions = {o.train_index for o in overlaps if o.train_set == name}
        reports[name].contaminated = len(hit_positions)
        if args.drop_contaminated and hit_positions:
            converted[name] = [row for i, row in enumerate(converted[name]) if i not in hit_positions]
            reports[name].contaminated_removed = len(hit_positions)
            reports[name].written = len(converted[name])

    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in converted.items():
        reports[name].output = str(write_parquet(rows, args.out_dir / f"{name}.parquet"))
    if args.combine_eval is not None and evals:
        write_parquet([row for name in evals for row in converted[name]], args.combine_eval)

    report_path = args.out_dir / REPORT_NAME
    report_path.write_text(
        json.dumps(
            {
                "template": args.template,
                "datasets": [reports[n].as_dict() for n in names],
                "contamination": [o.as_dict() for o in overlaps],
            },
            indent=2,
            ensure_ascii=False,
        ),
        encoding="utf-8",
    )
    _print_summary([reports[n] for n in names])
    if overlaps:
        action = "removed" if args.drop_contaminated else "kept (use --drop-contaminated to remove them)"
        print(f"contamination: {len(overlaps)} training rows also in an eval set, {action}")
        for o in overlaps[:10]:
            print(f"  {o.train_set}[{o.train_index}] = {o.eval_set}[{o.eval_index}]: {o.question[:80]!r}")
    elif train and evals:
        print("contamination: no training question appears in the converted eval sets")
    print(f"wrote {len(converted)} parquet files and {report_path}")
    return 0


def run_contamination(args: argparse.Namespace) -> int:
    train = {str(p): read_parquet(p) for p in args.train}
    evals = {str(p): read_parquet(p) for p in args.eval}
    overlaps = find_overlaps(train, evals)
    for o in overlaps:
        print(f"{o.train_set}[{o.train_index}] = {o.eval_set}[{o.eval_index}]: {o.question[:80]!r}")
    print(f"{len(overlaps)} overlapping rows between {len(train)} training and {len(evals)} evaluation files")
    if args.report is not None:
        args.report.write_text(json.dumps([o.as_dict() for o in overlaps], indent=2, ensure_ascii=False))
    return 0


def run_list() -> int:
    for group, members in GROUPS.items():
        print(f"group {group}: {' '.join(members)}")
    print()
    for spec in DATASETS.values():
        config = f" ({spec.hub_config})" if spec.hub_config else ""
        print(f"{spec.name:<16}{spec.kind:<6} {spec.hub_id}{config} [{spec.hub_split}]")
        print(f"{'':<23}{spec.description}")
    print()
    for name, template in TEMPLATES.items():
        default = " (default)" if name == DEFAULT_TEMPLATE else ""
        print(f"template {name}{default}: {template.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for a bad argument, with the reason on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "list":
            return run_list()
        if args.command == "convert":
            return run_convert(args)
        return run_contamination(args)
    except (ValueError, OSError) as error:  # OSError: missing/unreadable files; pyarrow's errors are ValueErrors
        print(f"error: {error}", file=sys.stderr)
        return 2
