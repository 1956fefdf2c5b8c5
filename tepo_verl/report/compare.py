"""`tepo-verl compare RUN ...`: compare algorithms from verl file-logger runs (CPU or GPU).

Per algorithm (runs with the same label are seeds, aggregated as mean and spread): final and best validation
accuracy, steps and wall time to reach a target accuracy (the paper's "50% less convergence time" is reported
directly as a steps-to-target ratio), entropy at start and end, mean response length, mean KL-mask fraction.
Writes compare.md, compare.csv and PNG plots (validation accuracy, reward, entropy, KL-mask fraction vs step).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path

import pandas as pd

from tepo_verl.report.runs import ENTROPY, MASK_FRAC, RESPONSE_LENGTH, REWARD, STEP_TIME, Run, load_runs

PLOTS = {
    "val_accuracy": ("validation accuracy", Run.val_accuracy),
    "reward": ("training reward (critic/score/mean)", lambda run: run.series(REWARD)),
    "entropy": ("policy entropy (actor/entropy)", lambda run: run.series(ENTROPY)),
    "kl_mask_fraction": ("TEPO KL-mask fraction", lambda run: run.series(MASK_FRAC)),
}


def steps_to_target(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first step whose validation accuracy is >= target, or None."""
    return next((step for step, value in curve if value >= target), None)


def wall_time_to(run: Run, step: int) -> float:
    """Seconds of training (sum of verl's timing_s/step) up to and including `step`."""
    return sum(value for s, value in run.series(STEP_TIME) if s <= step)


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else math.nan


def _spread(values):
    values = [v for v in values if v is not None]
    return statistics.stdev(values) if len(values) > 1 else 0.0 if values else math.nan


def _series_mean(run: Run, name: str) -> float | None:
    """Mean of a run's metric over its steps, or None when the run never logged it."""
    values = [v for _, v in run.series(name)]
    return statistics.fmean(values) if values else None


def auto_target(runs: list[Run]) -> float:
    """90% of the lowest, over algorithms, of the best seed-mean validation accuracy: reachable by every one."""
    best = []
    for group in group_by_label(runs).values():
        per_step = defaultdict(list)
        for run in group:
            for step, value in run.val_accuracy():
                per_step[step].append(value)
        if per_step:
            best.append(max(_mean(v) for v in per_step.values()))
    if not best:
        raise ValueError("no validation accuracy (val-core/*/acc|reward/mean@N) in any run: set --target")
    return 0.9 * min(best)


def group_by_label(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.label].append(run)
    return dict(groups)


def summarize(runs: list[Run], target: float) -> pd.DataFrame:
    rows = []
    for label, group in group_by_label(runs).items():
        finals, bests, reach_steps, reach_times, ent0, ent1, lengths, masks, steps = ([] for _ in range(9))
        for run in group:
            curve = run.val_accuracy()
            finals.append(curve[-1][1] if curve else None)
            bests.append(max(v for _, v in curve) if curve else None)
            reached = steps_to_target(curve, target)
            reach_steps.append(reached)
            reach_times.append(None if reached is None else wall_time_to(run, reached))
            entropy = run.series(ENTROPY)
            ent0.append(entropy[0][1] if entropy else None)
            ent1.append(entropy[-1][1] if entropy else None)
            lengths.append(_series_mean(run, RESPONSE_LENGTH))
            masks.append(_series_mean(run, MASK_FRAC))
            steps.append(max(run.metrics) if run.metrics else 0)
        rows.append({
            "algorithm": label,
            "seeds": len(group),
            "steps": max(steps),
            "final_val_acc": _mean(finals),
            "final_val_acc_std": _spread(finals),
            "best_val_acc": _mean(bests),
            "best_val_acc_std": _spread(bests),
            "reached_target": f"{sum(r is not None for r in reach_steps)}/{len(group)}",
            "steps_to_target": _mean(reach_steps),
            "steps_to_target_std": _spread(reach_steps),
            "wall_s_to_target": _mean(reach_times),
            "entropy_start": _mean(ent0),
            "entropy_end": _mean(ent1),
            "response_length": _mean(lengths),
            "kl_mask_fraction": _mean(masks),
        })
    return pd.DataFrame(rows).sort_values("algorithm", kind="stable").reset_index(drop=True)


def default_reference(labels) -> str | None:
    """`tepo`, or the one label that starts with `tepo-` (the GPU recipes' `tepo-<model>`), else None."""
    labels = list(labels)
    if "tepo" in labels:
        return "tepo"
    candidates = [label for label in labels if label.startswith("tepo-")]
    return candidates[0] if len(candidates) == 1 else None


def step_ratios(table: pd.DataFrame, reference: str | None) -> dict[str, float]:
    """steps_to_target(reference) / steps_to_target(other) for every other algorithm (< 1: reference is faster)."""
    by_label = table.set_index("algorithm")["steps_to_target"]
    if reference is None or reference not in by_label:
        return {}
    return {other: by_label[reference] / value for other, value in by_label.items()
            if other != reference and value and not math.isnan(value)}


def plot(runs: list[Run], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, (title, getter) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = False
        for label, group in sorted(group_by_label(runs).items()):
            per_step = defaultdict(list)
            for run in group:
                for step, value in getter(run):
                    per_step[step].append(value)
            if not per_step:
                continue
            xs = sorted(per_step)
            means = [_mean(per_step[x]) for x in xs]
            (line,) = ax.plot(xs, means, marker="o", markersize=3, label=f"{label} (n={len(group)}, mean, min-max)")
            if len(group) > 1:
                ax.fill_between(xs, [min(per_step[x]) for x in xs], [max(per_step[x]) for x in xs],
                                color=line.get_color(), alpha=0.2)
            drawn = True
        if drawn:
            ax.set(title=title, xlabel="step")
            ax.grid(alpha=0.3)
            ax.legend()
            path = out_dir / f"{name}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=120)
            written.append(path)
        plt.close(fig)
    return written


def render(table: pd.DataFrame, target: float, ratios: dict[str, float], reference: str) -> str:
    lines = [f"Target validation accuracy: {target:.4f}", "", table.to_markdown(index=False, floatfmt=".4g"), ""]
    for other, ratio in ratios.items():
        change = f"{(1 - ratio) * 100:.1f}% fewer" if ratio <= 1 else f"{(ratio - 1) * 100:.1f}% more"
        lines.append(f"steps-to-target {reference} / {other} = {ratio:.3f} ({change} steps for {reference})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tepo-verl compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="verl file-logger .jsonl files or folders, optionally LABEL=PATH "
                        "(default label: the file name without a -seedN suffix)")
    parser.add_argument("--target", type=float, default=None,
                        help="validation accuracy to reach (default: 90%% of the lowest best mean accuracy)")
    parser.add_argument("--reference", default=None,
                        help="algorithm whose steps-to-target ratios are reported (default: tepo, or tepo-<model>)")
    parser.add_argument("--out", type=Path, default=Path("compare"), help="folder for compare.md/.csv and PNGs")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)

    runs = load_runs(args.runs)
    target = auto_target(runs) if args.target is None else args.target
    table = summarize(runs, target)
    reference = args.reference or default_reference(table["algorithm"])
    ratios = step_ratios(table, reference)
    text = render(table, target, ratios, reference)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "compare.csv", index=False)
    (args.out / "compare.md").write_text(text, encoding="utf-8")
    plots = [] if args.no_plots else plot(runs, args.out)
    print(text)
    print(f"wrote {args.out / 'compare.md'}, {args.out / 'compare.csv'}" + "".join(f", {p}" for p in plots))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
