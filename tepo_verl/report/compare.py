"""`tepo-verl compare RUN ...`: compare algorithms from verl file-logger runs (CPU or GPU), seeds included.

Runs with the same label are seeds of one algorithm; the seed number in a run's name (`-seedN`) pairs runs
across algorithms. Per run: steps, rollouts (generated responses) and training wall time to a target validation
accuracy (a run that never reaches it is censored at its last validated step and flagged), best and final
validation accuracy, the area under the validation curve normalised by its step span, the entropy at start and
end (one definition for every algorithm: tepo_verl/entropy_token_mean), response length, KL-mask fraction, the
share of positive-advantage tokens the mask selects, masked KL, the penalty's strength (its mean |gradient| over
the policy term's, on masked tokens) and clipped fraction. Per algorithm: the seed mean of each, with a 95%
percentile-bootstrap interval for CI_METRICS (the to-target quantities, the accuracies, the curve's area and the final
entropy). Per baseline: the per-seed paired difference of the reference algorithm (TEPO) minus the baseline, with its
bootstrap interval and the two-sided p-value of a sign-flip permutation test (exact up to EXACT_PAIRS pairs). With few
seeds the percentile bootstrap is too narrow, and the test's smallest possible p-value is 2 / 2**pairs (0.0625 for 5
pairs). The ratio of mean steps to target, reference over baseline, is taken over the seeds both ran.
Writes compare.md, compare.csv (per algorithm), compare_runs.csv (per run), compare_paired.csv and PNG plots.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

from tepo_verl.extras import require

require("report", __name__)  # one line naming the extra, before pandas/scipy fail to import

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from tepo_verl.report.runs import (  # noqa: E402
    CHECKPOINT_TIME,
    CLIP_FRAC,
    ENTROPY,
    MASK_FRAC,
    MASK_FRAC_POSITIVE,
    MASKED_KL,
    RESPONSE_LENGTH,
    RESPONSES_GENERATED,
    REWARD,
    STEP_TIME,
    Run,
    RunError,
    load_runs,
)

PLOTS = {
    "val_accuracy": ("validation accuracy", Run.val_accuracy),
    "reward": ("training reward (critic/score/mean)", lambda run: run.series(REWARD)),
    "entropy": ("old-policy entropy, token-mean (tepo_verl/entropy_token_mean)", lambda run: run.series(ENTROPY)),
    "clip_fraction": ("clipped share of the tokens (actor/pg_clipfrac)", lambda run: run.series(CLIP_FRAC)),
    "kl_mask_fraction": ("TEPO KL-mask fraction (actor/tepo/mask_frac)", lambda run: run.series(MASK_FRAC)),
    "masked_kl": ("TEPO masked KL (actor/tepo/masked_kl_mean)", lambda run: run.series(MASKED_KL)),
    "mask_share_positive": ("TEPO: share of positive-advantage tokens masked (actor/tepo/mask_frac_positive)",
                            lambda run: run.series(MASK_FRAC_POSITIVE)),
    "penalty_strength": ("TEPO: the penalty's share of the |gradient| on masked tokens (actor/tepo/penalty_grad_share)",
                         Run.penalty_strength),
}

#: Per-run quantities that get a seed mean with a bootstrap interval, and a paired difference against the reference.
CI_METRICS = ["steps_to_target", "rollouts_to_target", "wall_s_to_target", "best_val_acc", "final_val_acc",
              "val_auc", "entropy_end"]
#: Per-run quantities that get a plain seed mean.
MEANS = ["entropy_start", "response_length", "kl_mask_fraction", "mask_share_positive", "masked_kl",
         "penalty_strength", "clip_fraction"]
#: The per-algorithm table's columns after the run counts.
SUMMARY_COLUMNS = [*CI_METRICS[:-1], "entropy_start", "entropy_end", *MEANS[1:]]
TO_TARGET = ("steps_to_target", "rollouts_to_target", "wall_s_to_target")
#: Per-run quantities measured on the training batch: on a filtered batch (dynamic sampling) they describe the kept
#: groups only, so they are not paired across a filtered and an unfiltered algorithm.
BATCH_METRICS = ("entropy_start", "entropy_end", "response_length")
#: The plots of training-batch metrics, whose filtered-batch curves are marked.
BATCH_PLOTS = ("reward", "entropy")
CONFIDENCE = 0.95
#: Up to this many pairs the sign-flip test enumerates every sign pattern (2**pairs); beyond, it samples them.
EXACT_PAIRS = 16


# ------------------------------------------------------------------ per run

def steps_to_target(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first step whose validation accuracy is >= target, or None."""
    return next((step for step, value in curve if value >= target), None)


def cumulative_to(run: Run, name: str, step: int) -> float | None:
    """Sum of a per-step metric over the training steps up to and including `step`; None if the run never logs
    it (a run that logs it on some steps only counts the missing steps as 0)."""
    series = run.series(name)
    return sum(value for s, value in series if s <= step) if series else None


def wall_time_to(run: Run, step: int) -> float | None:
    """Training seconds up to and including `step`: verl's timing_s/step (generation with any regeneration,
    log-probs, reference, update, weight sync; no validation) less its timing_s/save_checkpoint."""
    total = cumulative_to(run, STEP_TIME, step)
    return None if total is None else total - (cumulative_to(run, CHECKPOINT_TIME, step) or 0.0)


def val_auc(curve: list[tuple[int, float]]) -> float | None:
    """Trapezoidal area under the validation curve divided by its step span: the curve's mean accuracy over
    training (its only value when validated once)."""
    if not curve:
        return None
    steps, values = np.array([s for s, _ in curve], float), np.array([v for _, v in curve], float)
    span = steps[-1] - steps[0]
    return float(values[0]) if span == 0 else float(np.trapezoid(values, steps) / span)


def _first_last(series):
    return (series[0][1], series[-1][1]) if series else (None, None)


def _mean_of(series):
    return float(np.mean([v for _, v in series])) if series else None


def run_row(run: Run, target: float) -> dict:
    """One run's numbers. A run that never reaches the target is censored at its last validated step: its
    steps/rollouts/time to target are those of that step (lower bounds) and `censored` is True."""
    curve = run.val_accuracy()
    reached = steps_to_target(curve, target)
    censored = reached is None and bool(curve)
    at = reached if reached is not None else (curve[-1][0] if curve else None)
    entropy_start, entropy_end = _first_last(run.series(ENTROPY))
    return {
        "algorithm": run.label,
        "seed": run.seed,
        "filtered_batch": run.filtered_batch,
        "run": str(run.path),
        "steps": max(run.metrics),
        "validations": len(curve),
        "reached": reached is not None,
        "censored": censored,
        "steps_to_target": at,
        "rollouts_to_target": None if at is None else cumulative_to(run, RESPONSES_GENERATED, at),
        "wall_s_to_target": None if at is None else wall_time_to(run, at),
        "best_val_acc": max(v for _, v in curve) if curve else None,
        "final_val_acc": curve[-1][1] if curve else None,
        "val_auc": val_auc(curve),
        "entropy_start": entropy_start,
        "entropy_end": entropy_end,
        "response_length": _mean_of(run.series(RESPONSE_LENGTH)),
        "kl_mask_fraction": _mean_of(run.series(MASK_FRAC)),
        "mask_share_positive": _mean_of(run.series(MASK_FRAC_POSITIVE)),
        "masked_kl": _mean_of(run.series(MASKED_KL)),
        "penalty_strength": _mean_of(run.penalty_strength()),
        "clip_fraction": _mean_of(run.series(CLIP_FRAC)),
    }


# ------------------------------------------------------------------ statistics

def _finite(values) -> np.ndarray:
    array = np.array([np.nan if v is None else v for v in values], dtype=float)
    return array[np.isfinite(array)]


def bootstrap_ci(values, *, confidence: float = CONFIDENCE, n_resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of `values` (None/NaN left out): resample the values with
    replacement `n_resamples` times with a fixed seed, and take the central `confidence` quantiles of the
    resampled means. NaN for fewer than two values."""
    data = _finite(values)
    if len(data) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(n_resamples, len(data)))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def sign_flip_p(differences, *, n_resamples: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of mean(differences) = 0: under the null each
    per-seed difference is as likely negative as positive, so its sign is flipped at random. Exact (every one of
    the 2**n patterns) for n <= EXACT_PAIRS; NaN for fewer than two differences."""
    data = _finite(differences)
    if len(data) < 2:
        return math.nan
    exact = len(data) <= EXACT_PAIRS
    # Ties: two sign patterns with the same mean in exact arithmetic can differ in their last bits (summation
    # order), and scipy's tie tolerance is relative to the observed mean, which can be far below the data's
    # scale. Rounding the mean at 1e-12 of the largest |difference| makes such patterns tie.
    scale = float(np.abs(data).max()) or 1.0

    def mean(values, axis=-1):
        return np.round(np.mean(values, axis=axis) / scale, 12)

    result = stats.permutation_test((data,), mean, permutation_type="samples", alternative="two-sided",
                                    n_resamples=np.inf if exact else n_resamples, random_state=seed)
    return float(result.pvalue)


def p_value_floor(pairs: int) -> str:
    """What the sign-flip test can show with this many pairs: its smallest p-value is 2 / 2**pairs."""
    if pairs < 2:
        return f"with {pairs} pair{'' if pairs == 1 else 's'} there is no test: p is nan"
    return f"with {pairs} pairs the smallest possible p is {2.0 ** (1 - pairs):.4g}"


def p_value_floors(pair_counts) -> str:
    """p_value_floor for each distinct pair count of a table, fewest pairs first: rows can differ in pairs."""
    return ", ".join(p_value_floor(pairs) for pairs in sorted({int(n) for n in pair_counts}))


def mean_of(values) -> float:
    data = _finite(values)
    return float(data.mean()) if len(data) else math.nan


def group_by_label(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.label].append(run)
    return dict(groups)


def auto_target(runs: list[Run]) -> float:
    """90% of the lowest, over algorithms, of the best seed-mean validation accuracy: reachable by every one."""
    best = []
    for group in group_by_label(runs).values():
        per_step = defaultdict(list)
        for run in group:
            for step, value in run.val_accuracy():
                per_step[step].append(value)
        if per_step:
            best.append(max(mean_of(v) for v in per_step.values()))
    if not best:
        raise RunError("no validation accuracy (val-core/<source>/acc|reward/mean@N) in any run: nothing to "
                       "compare (give --target and runs that validate)")
    return 0.9 * min(best)


def per_run_table(runs: list[Run], target: float) -> pd.DataFrame:
    rows = [run_row(run, target) for run in runs]
    table = pd.DataFrame(rows)
    order = table["seed"].fillna(-1)
    return table.assign(_order=order).sort_values(["algorithm", "_order", "run"], kind="stable").drop(
        columns="_order").reset_index(drop=True)


def summarize(per_run: pd.DataFrame, *, n_resamples: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """Per algorithm: seed means (with bootstrap intervals for CI_METRICS) of the per-run table."""
    rows = []
    for label, group in per_run.groupby("algorithm", sort=True):
        row = {"algorithm": label, "filtered_batch": bool(group["filtered_batch"].any()),
               "seeds": len(group), "steps": int(group["steps"].max()),
               "reached": int(group["reached"].sum()), "censored": int(group["censored"].sum())}
        for name in CI_METRICS:
            row[name] = mean_of(group[name])
            row[f"{name}_ci_low"], row[f"{name}_ci_high"] = bootstrap_ci(group[name], n_resamples=n_resamples,
                                                                         seed=seed)
        for name in MEANS:
            row[name] = mean_of(group[name])
        rows.append(row)
    return pd.DataFrame(rows)


def paired_differences(per_run: pd.DataFrame, reference: str | None, *, n_resamples: int = 10_000,
                       seed: int = 0) -> pd.DataFrame:
    """For each baseline and CI metric: the mean over seeds present in both of (reference - baseline) of that
    seed, with its bootstrap interval and sign-flip p-value. `censored_pairs` counts pairs where either run is
    censored (for the to-target metrics their difference is not a measured one). A BATCH_METRICS metric is not
    paired between an algorithm with a filtered batch and one without: it measures different batches."""
    columns = ["baseline", "metric", "pairs", "censored_pairs", "mean_difference", "ci_low", "ci_high", "p_value",
               "seeds"]
    if reference is None or reference not in set(per_run["algorithm"]):
        return pd.DataFrame(columns=columns)
    by_seed = {label: group.dropna(subset=["seed"]).set_index("seed")
               for label, group in per_run.groupby("algorithm")}
    ref = by_seed[reference]
    filtered = per_run.groupby("algorithm")["filtered_batch"].any()
    rows = []
    for baseline in sorted(set(per_run["algorithm"]) - {reference}):
        other = by_seed[baseline]
        seeds = sorted(set(ref.index) & set(other.index))
        for name in CI_METRICS:
            if name in BATCH_METRICS and filtered[reference] != filtered[baseline]:
                continue
            differences = [ref.at[s, name] - other.at[s, name] for s in seeds
                           if pd.notna(ref.at[s, name]) and pd.notna(other.at[s, name])]
            used = [s for s in seeds if pd.notna(ref.at[s, name]) and pd.notna(other.at[s, name])]
            censored = sum(bool(ref.at[s, "censored"] or other.at[s, "censored"]) for s in used) \
                if name in TO_TARGET else 0
            low, high = bootstrap_ci(differences, n_resamples=n_resamples, seed=seed)
            rows.append({"baseline": baseline, "metric": name, "pairs": len(differences),
                         "censored_pairs": censored, "mean_difference": mean_of(differences),
                         "ci_low": low, "ci_high": high,
                         "p_value": sign_flip_p(differences, n_resamples=n_resamples, seed=seed),
                         "seeds": " ".join(str(int(s)) for s in used)})
    return pd.DataFrame(rows, columns=columns)


def default_reference(labels) -> str | None:
    """`tepo`, or the one label that starts with `tepo-` (the GPU recipes' `tepo-<model>`), else None."""
    labels = list(labels)
    if "tepo" in labels:
        return "tepo"
    candidates = [label for label in labels if label.startswith("tepo-")]
    return candidates[0] if len(candidates) == 1 else None


def step_ratios(per_run: pd.DataFrame, reference: str | None) -> dict[str, tuple[float, str]]:
    """For every other algorithm: (mean steps_to_target of the reference / that of the other, the runs it is over).

    Over the seeds both algorithms ran when they share any, so that an arm with fewer seeds is not set against the
    reference's other seeds; over all runs of each otherwise. < 1: the reference is faster. Censored runs count at
    their censoring step."""
    if reference is None or reference not in set(per_run["algorithm"]):
        return {}
    groups = dict(tuple(per_run.groupby("algorithm")))
    ref = groups[reference]
    ratios = {}
    for other, runs in sorted(groups.items()):
        if other == reference:
            continue
        shared = sorted(set(ref["seed"].dropna()) & set(runs["seed"].dropna()))
        if shared:
            mine, theirs = ref[ref["seed"].isin(shared)], runs[runs["seed"].isin(shared)]
            over = "seeds " + " ".join(str(int(s)) for s in shared)
        else:
            mine, theirs, over = ref, runs, "all runs, no shared seeds"
        value = mean_of(theirs["steps_to_target"])
        if value and not math.isnan(value):
            ratios[other] = (mean_of(mine["steps_to_target"]) / value, over)
    return ratios


# ------------------------------------------------------------------ output

def _number(value, digits=4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    return f"{value:.{digits}g}"


def _with_ci(row, name) -> str:
    text = _number(row[name])
    if name in TO_TARGET and row["censored"]:
        text = ">= " + text  # some seeds are censored: the mean is a lower bound
    low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
    return text if math.isnan(low) else f"{text} [{_number(low)}, {_number(high)}]"


def _markdown(table: pd.DataFrame, text_columns: int) -> str:
    """Markdown table of preformatted cells: the first `text_columns` left-aligned, the numbers right-aligned."""
    align = ["left"] * text_columns + ["right"] * (len(table.columns) - text_columns)
    return table.to_markdown(index=False, disable_numparse=True, colalign=align)


def render(summary: pd.DataFrame, per_run: pd.DataFrame, paired: pd.DataFrame, target: float,
           ratios: dict[str, tuple[float, str]], reference: str | None) -> str:
    shown = pd.DataFrame({
        "algorithm": summary["algorithm"],
        "seeds": summary["seeds"].astype(str),
        "steps": summary["steps"].astype(str),
        "reached": [f"{r}/{n}" for r, n in zip(summary["reached"], summary["seeds"], strict=True)],
        **{name: [_with_ci(row, name) for _, row in summary.iterrows()] for name in CI_METRICS},
        **{name: [_number(v) for v in summary[name]] for name in MEANS},
    })[["algorithm", "seeds", "steps", "reached", *SUMMARY_COLUMNS]]
    lines = [f"Target validation accuracy: {target:.4f}", "",
             f"Per algorithm: seed mean [{CONFIDENCE:.0%} bootstrap interval over seeds]; '>=' marks a lower "
             "bound (some seeds never reached the target and count at their last validated step).", "",
             _markdown(shown, text_columns=1), ""]
    runs_shown = per_run[["algorithm", "seed", "steps", "reached", "steps_to_target", "rollouts_to_target",
                          "wall_s_to_target", "best_val_acc", "final_val_acc", "val_auc", "entropy_start",
                          "entropy_end"]].copy()
    runs_shown["seed"] = [("-" if pd.isna(s) else str(int(s))) for s in runs_shown["seed"]]
    runs_shown["reached"] = ["yes" if r else ("censored" if c else "no validation")
                             for r, c in zip(per_run["reached"], per_run["censored"], strict=True)]
    for name in runs_shown.columns[4:]:
        runs_shown[name] = [_number(v) for v in runs_shown[name]]
    lines += ["Per run:", "", _markdown(runs_shown.astype(str), text_columns=1), ""]
    if len(paired):
        lines += [f"Paired by seed: {reference} minus baseline, mean [{CONFIDENCE:.0%} bootstrap interval], and the "
                  f"two-sided sign-flip permutation p-value ({p_value_floors(paired['pairs'])}; with few "
                  "seeds the bootstrap interval is too narrow):", ""]
        shown_pairs = paired.assign(
            mean_difference=[_number(v) for v in paired["mean_difference"]],
            p_value=[_number(v, 3) for v in paired["p_value"]],
            ci=[("nan" if math.isnan(lo) else f"[{_number(lo)}, {_number(hi)}]")
                for lo, hi in zip(paired["ci_low"], paired["ci_high"], strict=True)],
        )[["baseline", "metric", "pairs", "censored_pairs", "mean_difference", "ci", "p_value", "seeds"]]
        lines += [_markdown(shown_pairs.astype(str), text_columns=2), ""]
    for other, (ratio, over) in ratios.items():
        change = f"{(1 - ratio) * 100:.1f}% fewer" if ratio <= 1 else f"{(ratio - 1) * 100:.1f}% more"
        lines.append(f"steps-to-target {reference} / {other} = {ratio:.3f} ({change} steps for {reference}; "
                     f"{over})")
    filtered = sorted(summary.loc[summary["filtered_batch"], "algorithm"])
    if filtered:
        lines.append(f"Trained on a filtered batch (dynamic sampling keeps the groups whose rewards differ): "
                     f"{', '.join(filtered)}. Their {', '.join(BATCH_METRICS)} and training reward describe the "
                     "kept groups, not the policy's samples, so they are not paired with an algorithm without the "
                     "filter.")
    missing = sorted(per_run.loc[per_run["entropy_start"].isna(), "run"])
    if missing:
        lines.append(f"no {ENTROPY} in {len(missing)} run(s) (logged by tepo-verl's hook in verl's v1 trainer, for a "
                     "run with TEPO_VERL_COMPARE_METRICS=1, docs/compare.md): " + ", ".join(missing))
    return "\n".join(lines) + "\n"


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
            means = [mean_of(per_step[x]) for x in xs]
            batch = " (filtered batch)" if name in BATCH_PLOTS and any(run.filtered_batch for run in group) else ""
            (line,) = ax.plot(xs, means, marker="o", markersize=3,
                              label=f"{label}{batch} (n={len(group)}, mean, min-max)")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tepo-verl compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="verl file-logger .jsonl (or .jsonl.gz) files or folders, "
                        "optionally LABEL=PATH (default label: the file name without a -seedN suffix)")
    parser.add_argument("--target", type=float, default=None,
                        help="validation accuracy to reach (default: 90%% of the lowest best mean accuracy)")
    parser.add_argument("--reference", default=None,
                        help="algorithm compared with every other one (default: tepo, or tepo-<model>)")
    parser.add_argument("--out", type=Path, default=Path("compare"), help="folder for the tables and PNGs")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--bootstrap-seed", type=int, default=0, help="bootstrap RNG seed (default 0)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)

    try:
        runs = load_runs(args.runs)
        target = auto_target(runs) if args.target is None else args.target
        per_run = per_run_table(runs, target)
        labels = sorted(set(per_run["algorithm"]))
        reference = args.reference or default_reference(labels)
        if args.reference is not None and args.reference not in labels:
            raise RunError(f"--reference {args.reference} is not one of the algorithms: {', '.join(labels)}")
        options = {"n_resamples": args.resamples, "seed": args.bootstrap_seed}
        summary = summarize(per_run, **options)
        paired = paired_differences(per_run, reference, **options)
        ratios = step_ratios(per_run, reference)
        text = render(summary, per_run, paired, target, ratios, reference)
        args.out.mkdir(parents=True, exist_ok=True)
        summary.to_csv(args.out / "compare.csv", index=False)
        per_run.to_csv(args.out / "compare_runs.csv", index=False)
        paired.to_csv(args.out / "compare_paired.csv", index=False)
        (args.out / "compare.md").write_text(text, encoding="utf-8")
    except (RunError, OSError) as error:
        print(f"tepo-verl compare: error: {error}", file=sys.stderr)
        return 2
    plots = [] if args.no_plots else plot(runs, args.out)
    print(text)
    print(f"wrote {args.out / 'compare.md'}, {args.out / 'compare.csv'}, {args.out / 'compare_runs.csv'}, "
          f"{args.out / 'compare_paired.csv'}" + "".join(f", {p}" for p in plots))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
