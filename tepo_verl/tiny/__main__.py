"""`python -m tepo_verl.tiny build [--out DIR] [--seed N] [--force] [--print KEY]`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from tepo_verl.tiny.build import TinySpec, build

    parser = argparse.ArgumentParser(prog="python -m tepo_verl.tiny", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or reuse) the tiny model, tokenizer, parquet data and reward")
    b.add_argument("--out", default=None, help="output dir (default: ~/.cache/tepo-verl/tiny/<key>)")
    b.add_argument("--seed", type=int, default=TinySpec.seed)
    b.add_argument("--warmup-steps", type=int, default=TinySpec.warmup_steps)
    b.add_argument("--train-size", type=int, default=TinySpec.train_size)
    b.add_argument("--val-size", type=int, default=TinySpec.val_size)
    b.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    b.add_argument("--print", dest="field", default=None,
                   help="print only this path (model, train, val, reward, reward_name, dir) instead of the manifest")
    args = parser.parse_args(argv)

    spec = dataclasses.replace(TinySpec(), seed=args.seed, warmup_steps=args.warmup_steps,
                               train_size=args.train_size, val_size=args.val_size)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.field else print
    manifest = build(args.out, spec, force=args.force, log=log)
    if args.field:
        if args.field == "dir":
            from pathlib import Path

            print(Path(manifest["paths"]["model"]).parent)
        else:
            print(manifest["paths"][args.field])
    else:
        print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
