"""`tepo-lab demo` (what `make demo` runs): TEPO, GRPO and DAPO through verl's real trainer on the tiny task,
then the comparison table and the paths of its plots.

    tepo-lab demo                               # tepo, grpo, dapo; 6 steps each; runs/demo/
    tepo-lab demo --algos tepo,grpo --steps 10 --seed 2 --runs-root runs/mine

Each run is `recipes/cpu.sh` (python -m verl.trainer.main_ppo with a tepo-verl preset: Ray, FSDP2 actor, vLLM
rollout, on CPU). verl's whole output goes to the run's folder (console.log, beside metrics.jsonl and the saved
validation generations); the console shows one line per training step or validation, read from verl's
file-logger JSONL as it grows: step k/N, mean training reward and validation accuracy (and, for DAPO, how many
groups dynamic sampling threw away and regenerated). The end is `tepo-verl compare` over the runs, then what those
numbers can and cannot say: six steps of a 150k-parameter model show the machinery, not a ranking; the committed
study's headline (per arm, the area under its validation curve, the chain study's pre-registered primary metric,
computed here from its committed runs with tepo_verl.report) and the path of its validation plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from tepo_verl.config import preset_names

#: The checkout the lab is installed from (editable, as `make` installs it): the demo runs its recipes/cpu.sh.
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cpu.sh"
DEFAULT_ALGOS = ("tepo", "grpo", "dapo")
REWARD = "critic/score/mean"
EVICTED = "training/filter_groups/evicted_samples"
#: Seconds between two reads of a run's metrics file (verl logs a step every few seconds on the tiny models).
POLL_S = 1.0
#: The committed studies the demo quotes, in order of preference: the first whose main comparison has finished
#: runs of two arms or more is quoted. Each is benchmarks/results/<name>/ with run folders <arm>-seed<k>/
#: (metrics.jsonl.gz, run.json), study.json, and compare/main/ (the main arms' comparison: compare.csv,
#: val_accuracy.png).
STUDIES = ("cpu-chain", "cpu-scratchpad")
STUDY_ROOT = REPO / "benchmarks" / "results"
#: Columns of the comparison's per-algorithm CSV shown on the console (all of them are in compare.md).
SUMMARY_COLUMNS = [
    ("algorithm", "algorithm"), ("steps", "steps"), ("best_val_acc", "best val acc"),
    ("final_val_acc", "final val acc"), ("steps_to_target", "steps to target"),
    ("rollouts_to_target", "rollouts to target"), ("kl_mask_fraction", "KL-mask frac"),
]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tepo-lab demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", default=",".join(DEFAULT_ALGOS),
                        help=f"comma-separated presets, run in this order (default {','.join(DEFAULT_ALGOS)})")
    parser.add_argument("--steps", type=_positive, default=6, help="training steps per run (default 6)")
    parser.add_argument("--test-freq", type=_positive, default=3,
                        help="validate every N steps, and before training and at the end (default 3)")
    parser.add_argument("--seed", type=_positive, default=1, help="seed of every run (default 1)")
    parser.add_argument("--runs-root", type=Path, default=Path("runs/demo"),
                        help="folder of the runs and of the comparison (default runs/demo)")
    parser.add_argument("--timeout", type=_positive, default=900, help="seconds allowed per run (default 900)")
    return parser


def _algos(text: str) -> list[str]:
    valid = preset_names()
    algos = [name.strip() for name in text.split(",") if name.strip()]
    if not algos:
        raise ValueError(f"--algos names no preset; valid: {', '.join(valid)}")
    for name in algos:
        if name not in valid:
            raise ValueError(f"unknown algorithm {name!r} in --algos; valid: {', '.join(valid)}")
    if len(set(algos)) != len(algos):
        raise ValueError(f"--algos repeats a preset: {text!r}")
    return algos


def _records(path: Path, seen: int) -> tuple[list[dict], int]:
    """Complete JSONL lines of `path` after the first `seen` ones (a line still being written is left)."""
    if not path.exists():
        return [], seen
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]  # the last piece has no newline yet
    new = []
    for line in lines[seen:]:
        try:
            new.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return new, seen + len(new)


def _val_acc(data: dict) -> float | None:
    values = [v for k, v in data.items() if k.startswith("val-core/") and k.endswith("/acc/mean@1")]
    return sum(values) / len(values) if values else None


def progress_line(label: str, record: dict, steps: int, started: float) -> str:
    """One console line for one file-logger record: step k/N, reward, validation accuracy (when validated)."""
    data, step = record.get("data", {}), int(record.get("step", 0))
    parts = [f"[{label}] step {step}/{steps}"]
    if REWARD in data:
        parts.append(f"reward {data[REWARD]:.3f}")
    acc = _val_acc(data)
    if acc is not None:
        parts.append(f"val acc {acc:.3f}" + (" (before training)" if step == 0 else ""))
    if data.get(EVICTED):
        parts.append(f"regenerated {int(data[EVICTED])} all-equal groups")
    parts.append(f"{time.monotonic() - started:5.0f} s")
    return "  ".join(parts)


def _tail(path: Path, lines: int = 12) -> str:
    if not path.exists():
        return "(no log)"
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    useful = [line for line in text if "target_num_threads" not in line]
    return "\n".join(useful[-lines:])


def run_one(algo: str, args: argparse.Namespace, env: dict[str, str]) -> Path:
    """Run recipes/cpu.sh for one preset, printing a progress line per logged step; returns the run folder."""
    run_dir = (args.runs_root / f"{algo}-seed{args.seed}").resolve()
    if run_dir.exists():  # a previous demo's run: start clean, so the JSONL holds this run only
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    run_env = dict(env, ALGO=algo, STEPS=str(args.steps), SEED=str(args.seed), RUN_DIR=str(run_dir),
                   TEST_FREQ=str(args.test_freq), QUIET="1", COMPARE="0")
    run_env.pop("VERL_FILE_LOGGER_PATH", None)
    print(f"[{algo}] starting verl (Ray, FSDP2 actor, vLLM rollout; about 2 min to start); log: "
          f"{_show(run_dir / 'console.log')}", flush=True)
    started = time.monotonic()
    jsonl, seen = run_dir / "metrics.jsonl", 0
    with open(run_dir / "recipe.log", "w") as recipe_log:
        proc = subprocess.Popen(["bash", str(RECIPE)], env=run_env, cwd=REPO, stdout=recipe_log,
                                stderr=subprocess.STDOUT)
        try:
            while True:
                finished = proc.poll() is not None
                new, seen = _records(jsonl, seen)
                for record in new:
                    print(progress_line(algo, record, args.steps, started), flush=True)
                if finished:
                    break
                if time.monotonic() - started > args.timeout:
                    proc.terminate()
                    proc.wait(30)
                    raise RuntimeError(f"{algo}: no result after {args.timeout} s (--timeout); log: {run_dir}")
                time.sleep(POLL_S)
        except BaseException:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
            raise
    if proc.returncode != 0:
        # the recipe's own output ends with the reason: a set-up error, or the end of verl's log and its path
        raise RuntimeError(f"{algo}: recipes/cpu.sh failed (exit {proc.returncode}); the end of its output "
                           f"({_show(run_dir / 'recipe.log')}):\n{_tail(run_dir / 'recipe.log', 27)}")
    print(f"[{algo}] done in {time.monotonic() - started:.0f} s", flush=True)
    return run_dir


def _show(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _fmt(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        return value or "-"
    if number != number:  # nan
        return "-"
    return f"{number:.0f}" if number.is_integer() and abs(number) >= 1 else f"{number:.3g}"


def summary_table(csv_path: Path) -> str:
    """The per-algorithm comparison (compare.csv) as a compact fixed-width table."""
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns = [(key, title) for key, title in SUMMARY_COLUMNS if rows and key in rows[0]]
    cells = [[title for _, title in columns]] + [[_fmt(row[key]) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def compare(run_dirs: list[Path], out: Path, env: dict[str, str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    report = out / "compare.txt"
    with open(report, "w") as handle:
        proc = subprocess.run([sys.executable, "-m", "tepo_verl.report.compare", *map(str, run_dirs), "--out",
                               str(out)], env=env, stdout=handle, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        print(f"comparison failed (exit {proc.returncode}):\n{_tail(report)}", file=sys.stderr)
        return proc.returncode
    print(f"\nComparison ({_show(out / 'compare.md')}; full console report {_show(report)}):\n")
    print(summary_table(out / "compare.csv"))
    plots = sorted(out.glob("*.png"))
    print("\nPlots: " + (", ".join(_show(p) for p in plots) if plots else "none"))
    return 0


def study_runs(folder: Path) -> list[Path]:
    """The finished run folders of the study's main comparison (its arms: compare/main/compare.csv); none while
    fewer than two of its arms have one (a headline compares arms)."""
    from tepo_verl.report.runs import metrics_file

    table = folder / "compare" / "main" / "compare.csv"
    if not table.is_file():
        return []
    with open(table, newline="") as handle:
        arms = {row["algorithm"] for row in csv.DictReader(handle)}
    runs, arms_run = [], set()
    for run_json in sorted(folder.glob("*/run.json")):
        record = json.loads(run_json.read_text())
        if record.get("status") == "finished" and record.get("arm") in arms and \
                metrics_file(run_json.parent).is_file():
            runs.append(run_json.parent)
            arms_run.add(record["arm"])
    return runs if len(arms_run) >= 2 else []


def study_headline(studies=STUDIES, root: Path = STUDY_ROOT) -> list[str]:
    """The committed study's headline: per main arm, the seed mean and 95% bootstrap interval of the area under
    the validation curve (val_auc: the curve's mean over training, the chain study's primary metric), from its runs
    (tepo_verl.report), and the path of its validation plot. [] when no study has runs."""
    from tepo_verl.report.compare import CONFIDENCE, auto_target, per_run_table, summarize
    from tepo_verl.report.runs import load_runs

    for name in studies:
        folder = root / name
        runs = study_runs(folder)
        if runs:
            break
    else:
        return []
    loaded = load_runs([str(path) for path in runs])
    summary = summarize(per_run_table(loaded, auto_target(loaded)))  # val_auc does not depend on the target
    regime = json.loads((folder / "study.json").read_text()).get("regime", {}) if (folder / "study.json").is_file() \
        else {}
    seeds = sorted({int(n) for n in summary["seeds"]})
    setting = ", ".join(part for part in (f"{regime['TASK']} task" if "TASK" in regime else "",
                                          f"{regime['STEPS']} steps" if "STEPS" in regime else "",
                                          f"{'-'.join(map(str, seeds))} seeds per arm") if part)
    arms = ", ".join(f"{row.algorithm} {row.val_auc:.3f} " + (
        f"[{row.val_auc_ci_low:.3f}, {row.val_auc_ci_high:.3f}]" if not math.isnan(row.val_auc_ci_low)
        else f"(no interval: {row.seeds} seed)") for row in summary.itertuples())  # NaN: a single seed
    plot = folder / "compare" / "main" / "val_accuracy.png"
    return [f"The committed study ({_show(folder)}: {setting}), area under the validation curve, seed mean "
            f"[{CONFIDENCE:.0%} interval]: {arms} (the whole comparison: docs/results.md)",
            f"Its validation curves: {_show(plot) if plot.is_file() else '(no plot committed)'}"]


def context_lines(steps: int, parameters: int | None) -> list[str]:
    """What the demo's numbers mean: a caveat, then the committed study's headline."""
    size = f"{parameters / 1000:.0f}k-parameter" if parameters else "tiny"
    caveat = (f"These runs show verl's trainer running each algorithm; {steps} steps of a {size} model cannot rank "
              f"algorithms: that takes tens of steps and several seeds.")
    return [caveat, *study_headline()]


def checkout_problem(recipe: Path | None = None) -> str | None:
    """None when the lab runs from a checkout of tepo-verl (it needs recipes/cpu.sh there), else where to run it."""
    recipe = RECIPE if recipe is None else recipe
    if recipe.is_file():
        return None
    return (f"the demo runs from a checkout of tepo-verl, where `make demo` runs it (no {recipe} beside this "
            f"tepo_lab: install the lab from the checkout, as `make install` does)")


def check_stack() -> str | None:
    """None when the tested CPU stack is installed, else why not (one line)."""
    check = subprocess.run([sys.executable, "-m", "tepo_lab.cpu.versions"], capture_output=True, text=True)
    if check.returncode == 0:
        return None
    reason = "; ".join(line.strip() for line in check.stderr.strip().splitlines()[:3])
    return (f"the CPU stack is not the tested one ({reason}); `make demo` installs it, or: "
            "bash lab/tepo_lab/cpu/install_cpu.sh")


def prepare_tiny() -> tuple[str, int | None]:
    """Set up (once) or reuse the tiny model and task; returns a one-line description and its parameter count."""
    dry = subprocess.run([sys.executable, "-m", "tepo_lab.tiny", "build", "--dry-run"], capture_output=True,
                         text=True)
    if dry.returncode == 0 and not json.loads(dry.stdout).get("built"):
        print("[tiny] setting up the tiny model and task once (cached in ~/.cache/tepo-verl/tiny)", flush=True)
    build = subprocess.run([sys.executable, "-m", "tepo_lab.tiny", "build", "--print", "dir"], capture_output=True,
                           text=True)
    if build.returncode != 0:
        raise RuntimeError(f"the tiny build failed:\n{build.stderr[-2000:]}")
    manifest = json.loads((Path(build.stdout.strip()) / "manifest.json").read_text())
    return (f"[tiny] {manifest['parameters']:,}-parameter Qwen2, warm-up accuracy "
            f"{manifest['val_accuracy_sampled_t1']:.3f} (sampled), {manifest['spec']['val_size']} validation "
            f"problems"), manifest["parameters"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        algos = _algos(args.algos)
        if args.runs_root.exists() and not args.runs_root.is_dir():
            raise ValueError(f"--runs-root {args.runs_root} is a file, not a folder")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # The recipe and verl's workers use this interpreter and its environment's tools, activated or not (make).
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PYTHON=sys.executable, PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))
    if (Path(bin_dir).parent / "pyvenv.cfg").is_file():
        env["VIRTUAL_ENV"] = str(Path(bin_dir).parent)
    problem = checkout_problem() or check_stack()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    started = time.monotonic()
    print(f"tepo-lab demo: {', '.join(algos)} on the tiny addition task, {args.steps} steps each, seed {args.seed}; "
          f"runs in {_show(args.runs_root.resolve())}", flush=True)
    try:
        tiny, parameters = prepare_tiny()
        print(tiny, flush=True)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    run_dirs = []
    try:
        for algo in algos:
            run_dirs.append(run_one(algo, args, env))
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    code = compare(run_dirs, args.runs_root.resolve() / "compare", env)
    if code == 0:
        print("\n" + "\n".join(context_lines(args.steps, parameters)))
    print(f"\ntepo-lab demo: {len(run_dirs)} runs in {time.monotonic() - started:.0f} s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
