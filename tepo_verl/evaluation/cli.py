"""`python -m tepo_verl.evaluation` (or `tepo-verl eval`): score saved generations per benchmark.

    python -m tepo_verl.evaluation VAL_DIR_OR_JSONL... --datasets data/val.parquet --out-dir results/

Reads verl's validation dumps (`trainer.validation_data_dir`, the newest `{step}.jsonl` of a folder unless
--step) or any jsonl with data_source, response and ground truth; grades every response with tepo_verl.reward
(the training reward); prints avg@n, pass@k and maj@n per benchmark and their average, and writes
results.csv and results.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tepo_verl.evaluation.grading import grade_samples
from tepo_verl.evaluation.report import build_table, to_markdown, to_text, write_csv
from tepo_verl.evaluation.samples import SourceMap, read_records, resolve_files, to_samples
from tepo_verl.reward import ISOLATIONS
from tepo_verl.reward.math_reward import DEFAULT_TIMEOUT_S


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tepo_verl.evaluation", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="jsonl files, or folders of verl's {step}.jsonl")
    parser.add_argument("--out-dir", type=Path, help="write results.csv and results.md here")
    parser.add_argument("--step", type=int, help="the training step to evaluate (folder file or 'step' field)")
    parser.add_argument("--datasets", nargs="*", type=Path, default=[], help="val parquet files: map prompts to sets")
    parser.add_argument("--data-source", help="the benchmark name for samples that have none")
    parser.add_argument("--k", nargs="+", type=int, help="pass@k values (default 1, 2, 4, ... up to n)")
    parser.add_argument("--use-saved", action="store_true", help="trust saved acc/pred instead of regrading")
    parser.add_argument("--threads", type=int, default=8, help="grading threads (default 8)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds per response, a timeout scores incorrect (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--isolation", choices=ISOLATIONS, help="grader isolation (default: process)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad input, with the reason on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        if args.k is not None and any(k < 1 for k in args.k):
            raise ValueError(f"--k values must be >= 1, got {args.k}")
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        if not args.timeout > 0:
            raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout}")
        if args.out_dir is not None and args.out_dir.exists() and not args.out_dir.is_dir():
            raise ValueError(f"--out-dir {args.out_dir} is a file, not a folder")
        records = read_records(resolve_files(args.inputs, args.step), args.step)
        source_map = SourceMap(args.datasets) if args.datasets else None
        samples = to_samples(records, source_map, args.data_source)
        timeouts = grade_samples(
            samples, use_saved=args.use_saved, threads=args.threads, timeout_s=args.timeout,
            isolation=args.isolation, progress=not args.no_progress,
        )
        rows = build_table(samples, args.k)
    except (ValueError, OSError) as error:  # OSError: missing/unreadable files; pyarrow's errors are ValueErrors
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(to_text(rows), end="")
    print(f"{len(samples)} samples graded" + (f", {timeouts} timed out (scored incorrect)" if timeouts else ""))
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(rows, args.out_dir / "results.csv")
        (args.out_dir / "results.md").write_text(to_markdown(rows), encoding="utf-8")
        print(f"wrote {args.out_dir / 'results.csv'} and {args.out_dir / 'results.md'}")
    return 0
