"""Per-benchmark table of avg@n, pass@k and maj@n, plus the unweighted average over benchmarks."""

from __future__ import annotations

import csv
import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from tepo_verl.evaluation.metrics import majority_vote, mean_accuracy, pass_at_k
from tepo_verl.evaluation.samples import Sample

AVERAGE = "average"


@dataclasses.dataclass
class Row:
    """One benchmark's results (fractions in [0, 1]); `pass_at` maps k to pass@k (None where some problem has
    fewer than k samples). For the average row, `n` is the smallest n and `problems` the sum."""

    benchmark: str
    problems: int
    n: int
    avg: float
    pass_at: dict[int, float | None]
    maj: float


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def build_table(samples: Sequence[Sample], ks: Sequence[int] | None = None) -> list[Row]:
    """Group graded samples by benchmark and prompt; one Row per benchmark (sorted by name) and the average.

    avg@n and maj@n use all n samples of each problem, averaged over problems; pass@k is averaged over problems
    for each k. Without `ks`, every benchmark reports default_ks(its smallest n).
    """
    problems: dict[str, dict[tuple[str, str], list[Sample]]] = defaultdict(lambda: defaultdict(list))
    for sample in samples:
        if sample.acc is None:
            raise ValueError("build_table needs graded samples (acc set)")
        problems[sample.data_source][(sample.prompt, str(sample.ground_truth))].append(sample)
    if not problems:
        raise ValueError("no samples to evaluate")
    min_n = min(len(group) for groups in problems.values() for group in groups.values())
    ks = sorted(set(ks or default_ks(min_n)))
    rows = []
    for benchmark in sorted(problems):
        groups = list(problems[benchmark].values())
        accs = [[float(s.acc) for s in g] for g in groups]
        n = min(len(a) for a in accs)
        rows.append(
            Row(
                benchmark=benchmark,
                problems=len(groups),
                n=n,
                avg=sum(mean_accuracy(a) for a in accs) / len(accs),
                pass_at={
                    k: (sum(pass_at_k(len(a), int(sum(a)), k) for a in accs) / len(accs) if k <= n else None)
                    for k in ks
                },
                maj=sum(majority_vote([s.pred for s in g], [float(s.acc) for s in g]) for g in groups) / len(groups),
            )
        )
    rows.append(
        Row(
            benchmark=AVERAGE,
            problems=sum(r.problems for r in rows),
            n=min(r.n for r in rows),
            avg=sum(r.avg for r in rows) / len(rows),
            pass_at={
                k: (None if any(r.pass_at[k] is None for r in rows) else sum(r.pass_at[k] for r in rows) / len(rows))
                for k in ks
            },
            maj=sum(r.maj for r in rows) / len(rows),
        )
    )
    return rows


def _header(rows: Sequence[Row]) -> list[str]:
    return ["benchmark", "problems", "n", "avg@n"] + [f"pass@{k}" for k in rows[0].pass_at] + ["maj@n"]


def _cells(row: Row, fmt) -> list[str]:
    values = [row.avg, *row.pass_at.values(), row.maj]
    return [row.benchmark, str(row.problems), str(row.n)] + ["-" if v is None else fmt(v) for v in values]


def to_markdown(rows: Sequence[Row]) -> str:
    """A markdown table, scores in percent with one decimal."""
    header = _header(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(_cells(r, lambda v: f"{100 * v:.1f}")) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_text(rows: Sequence[Row]) -> str:
    """An aligned plain-text table for the terminal, scores in percent."""
    table = [_header(rows)] + [_cells(r, lambda v: f"{100 * v:.1f}") for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    out = []
    for number, line in enumerate(table):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))))
        if number == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out) + "\n"


def write_csv(rows: Sequence[Row], path: Path) -> None:
    """CSV with scores as fractions (6 decimals); empty cells where pass@k is undefined."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(_header(rows))
        for row in rows:
            writer.writerow([("" if c == "-" else c) for c in _cells(row, lambda v: f"{v:.6f}")])
