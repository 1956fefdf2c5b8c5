"""`python -m tepo_lab.tiny build [--task addition|scratchpad|chain] [--out DIR] [--seed N] [--force] [--retrain]
[--print KEY] [--dry-run]`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

#: What `--print` can print: the manifest's paths and the build folder.
PRINT_FIELDS = ("model", "train", "val", "reward", "reward_name", "dir")
#: The tasks built by lab/tepo_lab/tiny/scratchpad.py (the others: the addition task, lab/tepo_lab/tiny/build.py).
CHAIN_TASKS = ("scratchpad", "chain")


def _check(args: argparse.Namespace, spec) -> None:
    """Reject bad arguments before the (minute-long) build starts, naming the bad value and the valid ones."""
    from tepo_lab.tiny import task

    if args.field is not None and args.field not in PRINT_FIELDS:
        raise ValueError(f"unknown --print field {args.field!r}; valid: {', '.join(PRINT_FIELDS)}")
    if spec.warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be >= 0, got {spec.warmup_steps}")
    if spec.val_size < 1 or spec.train_size < 1:
        raise ValueError(f"--train-size and --val-size must be >= 1, got {spec.train_size} and {spec.val_size}")
    chains = args.task in CHAIN_TASKS
    available = (spec.distinct_problems() if chains
                 else len(task.all_problems(tuple(spec.a_range), tuple(spec.b_range))))
    if spec.train_size + spec.val_size > available and chains:
        raise ValueError(f"--train-size + --val-size exceeds the {available} distinct problems")
    if spec.train_size + spec.val_size > available:
        raise ValueError(f"--train-size + --val-size = {spec.train_size + spec.val_size} exceeds the {available} "
                         f"distinct problems of operands {spec.a_range[0]}..{spec.a_range[1]}")
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a file, not a folder")


def main(argv: list[str] | None = None) -> int:
    from tepo_lab.tiny.build import TinySpec, build

    parser = argparse.ArgumentParser(prog="python -m tepo_lab.tiny", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or reuse) the tiny model, tokenizer, parquet data and reward")
    b.add_argument("--out", default=None, help="output dir (default: ~/.cache/tepo-verl/tiny/<key>)")
    b.add_argument("--task", choices=("addition", *CHAIN_TASKS), default="addition",
                   help="addition: 'What is 37+45?' -> '82' (default); scratchpad: 4 operands, partial sums first; "
                        "chain: the scratchpad with 3 to 5 operands, each sum beside its operands")
    b.add_argument("--seed", type=int, default=None, help="default: the task's spec (0)")
    b.add_argument("--warmup-steps", type=int, default=None, help="default: the task's spec")
    b.add_argument("--train-size", type=int, default=None, help="default: the task's spec")
    b.add_argument("--val-size", type=int, default=None, help="default: the task's spec")
    b.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    b.add_argument("--retrain", action="store_true",
                   help="train the policy here instead of copying the one shipped for the default spec")
    b.add_argument("--dry-run", action="store_true",
                   help="build nothing: print where the build is (or would be) and whether it exists")
    b.add_argument("--print", dest="field", default=None,
                   help=f"print only this path ({', '.join(PRINT_FIELDS)}) instead of the manifest")
    args = parser.parse_args(argv)

    from tepo_lab.tiny import scratchpad

    given = {"seed": args.seed, "warmup_steps": args.warmup_steps, "train_size": args.train_size,
             "val_size": args.val_size}
    base = {"scratchpad": scratchpad.ScratchSpec, "chain": scratchpad.ChainSpec}.get(args.task, TinySpec)()
    spec = dataclasses.replace(base, **{name: value for name, value in given.items() if value is not None})
    try:
        _check(args, spec)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        from tepo_lab.tiny.build import default_cache_root, paths

        out = Path(args.out) if args.out is not None else (
            scratchpad.default_out(spec) if args.task in CHAIN_TASKS else default_cache_root() / spec.key())
        manifest = {"key": spec.key(), "spec": dataclasses.asdict(spec), "paths": paths(out),
                    "built": (out / "manifest.json").is_file()}
    else:
        log = (lambda msg: print(msg, file=sys.stderr)) if args.field else print
        builder = scratchpad.build if args.task in CHAIN_TASKS else build
        manifest = builder(args.out, spec, force=args.force, log=log, retrain=args.retrain)
    if args.field:
        if args.field == "dir":
            print(Path(manifest["paths"]["model"]).parent)
        else:
            print(manifest["paths"][args.field])
    else:
        print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
