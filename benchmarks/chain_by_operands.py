"""The validation accuracy of a chain-task run by number of operands, at every validation, from the generations
verl writes (trainer.validation_data_dir: <RUN_DIR>/val_generations/<step>.jsonl, one line per problem).

    python benchmarks/chain_by_operands.py RUN_DIR [--out CSV]

Prints the table and writes it as CSV (default RUN_DIR/validation_by_operands.csv): a column `all`, then one
`operands_K` column (accuracy) and one `n_K` column (problems) per operand count K.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from pathlib import Path

from tepo_verl.evaluation.samples import read_records

#: The chain task's question, "What is 17+37+10?" (lab/tepo_lab/tiny/scratchpad.py:question).
QUESTION = re.compile(r"What is ([0-9+]+)\?")


def operand_count(prompt: str) -> int:
    match = QUESTION.search(prompt)
    if match is None:
        raise ValueError(f"not a chain-task prompt: {prompt!r}")
    return match.group(1).count("+") + 1


def table(generations: Path) -> list[dict]:
    """One row per validation step: the overall accuracy and the accuracy and size of each operand count."""
    steps = sorted(int(path.stem) for path in generations.glob("*.jsonl") if re.fullmatch(r"\d+", path.stem))
    if not steps:
        raise ValueError(f"no validation generations (<step>.jsonl) in {generations}")
    rows = []
    for step in steps:
        by_count: dict[int, list[float]] = collections.defaultdict(list)
        for record in read_records([generations / f"{step}.jsonl"], step):  # the project's reader of verl's dumps
            by_count[operand_count(record["input"])].append(float(record["acc"]))
        scores = [score for group in by_count.values() for score in group]
        counts = sorted(by_count)
        rows.append({"step": step, "all": round(sum(scores) / len(scores), 4),
                     **{f"operands_{k}": round(sum(by_count[k]) / len(by_count[k]), 4) for k in counts},
                     **{f"n_{k}": len(by_count[k]) for k in counts}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        rows = table(args.run_dir / "val_generations")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = args.out or args.run_dir / "validation_by_operands.csv"
    counts = sorted({int(key.split("_")[1]) for row in rows for key in row if key.startswith("n_")})
    columns = ["step", "all", *(f"operands_{k}" for k in counts), *(f"n_{k}" for k in counts)]
    with out.open("w", newline="") as handle:  # a count missing from one validation is an empty cell
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    print("step  all    " + "  ".join(f"ops {k}" for k in counts))
    for row in rows:
        cells = (f"{row[f'operands_{k}']:.3f}" if f"operands_{k}" in row else "    -" for k in counts)
        print(f"{row['step']:4d}  {row['all']:.3f}  " + "  ".join(cells))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
