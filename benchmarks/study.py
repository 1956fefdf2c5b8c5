"""The CPU study: arms x seeds through recipes/cpu.sh in the paper's regime on the scratchpad task, resumable.

    python benchmarks/study.py                          # every arm and seed of the plan (hours: resumable)
    python benchmarks/study.py --arms main --seeds 1-5  # the five main arms only
    python benchmarks/study.py --list                   # the plan: arms, overrides, seeds, regime; runs nothing
    python benchmarks/study.py --lock FILE ...          # hold an flock on FILE during each run (a shared machine)

The regime (REGIME): the scratchpad task (tepo_verl/tiny/scratchpad.py) and its shipped starting policy, groups
of 8 responses, 8 PPO updates per step (mini-batches of 1/8 of the batch, one epoch), validation every
TEST_FREQ steps. Every arm of one seed gets the same learning rate, data order and seeds (recipes/cpu.sh's SEED),
so runs pair by seed. An arm is a preset (tepo_verl/config/algorithm/) plus verl overrides (the ablations).

Each finished run leaves, under benchmarks/results/<study>/<arm>-seed<k>/:
    metrics.jsonl   verl's raw file-logger JSONL (one {"step", "data"} line per step and validation)
    run.json        the exact command, the git commit it ran at (and the tracked files that differed from it),
                    the arm, seed, preset, overrides, regime, wall time
A run is finished when both exist and the JSONL reaches the last step; the runner skips finished runs, so the
study can span sessions (commit the results folder as it fills). verl's console log, validation generations and
the unfinished runs stay in runs/study/<study>/. The last thing the runner does is write the results page:

    python benchmarks/study.py --page    # only that, from the committed runs: runs nothing

`tepo-verl compare` on the main arms (into benchmarks/results/<study>/compare/main) and on the TEPO ablations with
the tepo, tepo_nomask and gspo arms beside them (compare/ablations), at the study's fixed target accuracy
(STUDY_TARGET), and the two comparisons' tables and plots spliced into docs/results.md between its study markers.
A test checks that the committed page equals what the committed runs give.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tepo_verl.report.runs import default_label
from tepo_verl.verl_adapter.precision import FLOAT32_OVERRIDES

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "cpu.sh"
PRESETS = REPO / "tepo_verl" / "config" / "algorithm"
DEFAULT_STUDY = "cpu-scratchpad"

#: The paper's regime, scaled to the tiny task: recipes/cpu.sh's environment for every run of the study.
REGIME = {
    "TASK": "scratchpad",  # responses of 26-29 tokens, reward on the final answer only
    "N": "8",              # group size 8
    "BATCH": "8",          # prompts per step (64 responses)
    "MINI": "1",           # BATCH / 8: 8 PPO updates per step, one epoch
    "STEPS": "80",
    "TEST_FREQ": "5",      # greedy validation on the 128 validation problems (and before training)
}
#: verl overrides for every run of the study (after the recipe's own): generate a whole batch at once, and let
#: the data loader start another (seeded) epoch rather than end a run early, as DAPO's dynamic sampling, which
#: draws a new batch for every regeneration, could exhaust the 2048 training prompts (STEPS still ends the run).
COMMON_OVERRIDES = ("actor_rollout_ref.rollout.max_num_seqs=128", "trainer.total_epochs=20")

ACTOR = "actor_rollout_ref.actor"
TEPO = f"{ACTOR}.policy_loss.tepo"


def _clip(low: str, high: str) -> tuple[str, ...]:
    return (f"{ACTOR}.clip_ratio={low}", f"{ACTOR}.clip_ratio_low={low}", f"{ACTOR}.clip_ratio_high={high}")


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    preset: str
    overrides: tuple[str, ...] = ()
    group: str = "main"
    why: str = ""


#: Every arm. The tepo arm is also the surprisal_old / kl_coef 1.0 / clip 3e-4,4e-4 point of each ablation.
ARMS = [
    Arm("tepo", "tepo", why="the default preset (mask surprisal_old, kl_coef 1, clip 3e-4/4e-4)"),
    Arm("tepo_nomask", "tepo_nomask", why="the mask ablation"),
    Arm("gspo", "gspo", why="verl's GSPO loss (sequence ratio, sequence-mean aggregation)"),
    Arm("grpo", "grpo", why="GRPO with its KL loss to the reference"),
    Arm("dapo", "dapo", why="DAPO with dynamic sampling"),
    # the mask rule (surprisal_old is the tepo arm); these two read the current entropy in the update pass
    Arm("tepo-mask_surprisal", "tepo", (f"{TEPO}.mask_rule=surprisal", f"{ACTOR}.calculate_entropy=true"),
        "ablation", "mask rule l + H > 0"),
    Arm("tepo-mask_old", "tepo", (f"{TEPO}.mask_rule=old", f"{ACTOR}.calculate_entropy=true"),
        "ablation", "mask rule H < H_old (the literal reading)"),
    # the KL coefficient on masked tokens (1.0 is the tepo arm, 0 is tepo_nomask)
    Arm("tepo-kl0.1", "tepo", (f"{TEPO}.kl_coef=0.1",), "ablation", "kl_coef 0.1"),
    Arm("tepo-kl10", "tepo", (f"{TEPO}.kl_coef=10.0",), "ablation", "kl_coef 10"),
    # the clip range of the sequence ratio: GSPO-scale 3e-4/4e-4 comes from 7B models at lr 1e-6; this model
    # trains at lr 1e-4. The same sweep for GSPO keeps the comparison fair.
    Arm("tepo-clip3e-3", "tepo", _clip("0.003", "0.004"), "ablation", "clip 3e-3/4e-3"),
    Arm("tepo-clip3e-2", "tepo", _clip("0.03", "0.04"), "ablation", "clip 3e-2/4e-2"),
    Arm("gspo-clip3e-3", "gspo", _clip("0.003", "0.004"), "ablation", "clip 3e-3/4e-3"),
    Arm("gspo-clip3e-2", "gspo", _clip("0.03", "0.04"), "ablation", "clip 3e-2/4e-2"),
    # the aggregation: tepo_nomask and gspo differ in loss_agg_mode alone (token-mean against seq-mean-token-mean),
    # so this arm runs verl's GSPO loss through the TEPO code path; set beside gspo it tells whether the gap in
    # clipped fraction between tepo_nomask and gspo comes from the aggregation or from the code path
    Arm("tepo_nomask-seqmean", "tepo_nomask", (f"{ACTOR}.loss_agg_mode=seq-mean-token-mean",), "ablation",
        "GSPO's seq-mean-token-mean aggregation (with the mask off, GSPO's loss)"),
    # the precision: on CPU verl's FSDP actor computes in bf16 and its log-probs arrive in bf16, where a ratio near
    # 1 resolves only about 4e-3; verl's built-in losses compute their ratio in that dtype, TEPO upcasts. These
    # arms compute the actor (and so the log-probs) in float32, as verl's flash-attn cross-entropy gives on a GPU
    Arm("tepo-fp32", "tepo", FLOAT32_OVERRIDES, "precision", "float32 actor and log-probs"),
    Arm("gspo-fp32", "gspo", FLOAT32_OVERRIDES, "precision", "float32 actor and log-probs"),
]
#: Seeds per group: at least 5 for each main arm; the ablations 2 (a screen for large effects); the precision
#: pair 5, to be read against the main arms. More seeds resume: --seeds 1-3 adds seed 3.
SEEDS = {"main": (1, 2, 3, 4, 5), "ablation": (1, 2), "precision": (1, 2, 3, 4, 5)}
#: The validation accuracy whose first crossing is "steps to target", fixed for every comparison of the study, so
#: the main and the ablation tables use one target (compare's default target depends on the arms compared). The
#: shipped policy starts at 0.516 greedy accuracy; 0.65 is about three standard errors of the 128-problem
#: validation above it. Fixed after one run (tepo seed 1, best 0.727) and before any other arm had run.
STUDY_TARGET = 0.65


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One generated table of the results page: the finished runs of the arms of `group`, with `beside` next to
    them, compared against `reference` (compare's --reference; None: its default, tepo)."""

    group: str
    title: str
    beside: tuple[str, ...] = ()
    reference: str | None = None


#: The results page's comparisons, in order, each by its folder under <results>/compare/. Beside the ablations:
#: TEPO's default point of every sweep, the mask off (beside the aggregation arm) and GSPO's clip point. Beside
#: the float32 pair: the same presets at verl's default bf16; the pair is read as a pair, so tepo-fp32 is the
#: reference.
COMPARISONS = {
    "main": Comparison("main", "Main arms"),
    "ablations": Comparison("ablation", "TEPO ablations (with the tepo, tepo_nomask and gspo arms beside them)",
                            beside=("tepo", "tepo_nomask", "gspo")),
    "precision": Comparison("precision",
                            "Float32 log-probs (tepo-fp32 against gspo-fp32, with the bf16 tepo and gspo arms)",
                            beside=("tepo", "gspo"), reference="tepo-fp32"),
}
#: docs/results.md's generated part lies between these lines.
PAGE_BEGIN = "<!-- study tables: generated by `python benchmarks/study.py --page` from the committed runs -->"
PAGE_END = "<!-- end of the generated study tables -->"


@dataclasses.dataclass(frozen=True)
class Run:
    arm: Arm
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm.name}-seed{self.seed}"


class StudyError(Exception):
    """Bad arguments or a study folder that does not match the plan; printed as one line."""


# -------------------------------------------------------------------------------------------------- the plan

def parse_seeds(text: str) -> tuple[int, ...]:
    """`1-5`, `1,3,7` or a mix (`1-3,6`)."""
    seeds: list[int] = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        try:
            low, _, high = part.partition("-")
            first, last = int(low), int(high or low)
        except ValueError:
            raise StudyError(f"bad --seeds {text!r}: use e.g. 1-5 or 1,3,7") from None
        if first < 1 or last < first:
            raise StudyError(f"bad --seeds {text!r}: seeds are positive, ranges ascending")
        seeds.extend(range(first, last + 1))
    if not seeds:
        raise StudyError(f"--seeds {text!r} names no seed")
    return tuple(dict.fromkeys(seeds))


def select_arms(text: str) -> list[Arm]:
    """`all`, `main`, `ablation`, or comma-separated arm names (groups may be mixed in)."""
    by_name = {arm.name: arm for arm in ARMS}
    chosen: list[Arm] = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        if part == "all":
            chosen.extend(ARMS)
        elif part in SEEDS:
            chosen.extend(arm for arm in ARMS if arm.group == part)
        elif part in by_name:
            chosen.append(by_name[part])
        else:
            raise StudyError(f"unknown arm {part!r}; valid: all, main, ablation, {', '.join(by_name)}")
    if not chosen:
        raise StudyError(f"--arms {text!r} names no arm")
    return list({arm.name: arm for arm in chosen}.values())


def plan(arms: list[Arm], seeds: tuple[int, ...] | None) -> list[Run]:
    """Seed-major order (every arm of seed 1, then seed 2, ...), so a study stopped early stays paired by seed."""
    per_arm = {arm.name: (seeds or SEEDS[arm.group]) for arm in arms}
    every = sorted({seed for values in per_arm.values() for seed in values})
    return [Run(arm, seed) for seed in every for arm in arms if seed in per_arm[arm.name]]


def check_presets(arms: list[Arm]) -> None:
    for arm in arms:
        if not (PRESETS / f"{arm.preset}.yaml").is_file():
            raise StudyError(f"arm {arm.name}: no preset {arm.preset!r} in {PRESETS}")


# ------------------------------------------------------------------------------------------------ the runs

def last_step(jsonl: Path) -> int | None:
    """The largest step of a file-logger JSONL (None when absent, empty or unreadable)."""
    try:
        steps = [int(json.loads(line)["step"]) for line in jsonl.read_text(encoding="utf-8").splitlines()
                 if line.strip()]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return max(steps) if steps else None


def finished(run_dir: Path, steps: int) -> bool:
    """metrics.jsonl reaches the last step and run.json records a finished run of this many steps."""
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return (record.get("status") == "finished" and int(record.get("regime", {}).get("STEPS", -1)) == steps
            and (last_step(run_dir / "metrics.jsonl") or 0) >= steps)


def git_state(repo: Path) -> dict:
    """The commit HEAD points at and the tracked files that differ from it (so a record says what ran)."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return out.stdout if out.returncode == 0 else ""

    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line[3:]]
    return {"commit": git("rev-parse", "HEAD").strip() or None, "changed_tracked_files": changed}


def command_for(run: Run, regime: dict, recipe: Path) -> tuple[dict, list[str]]:
    """(environment additions, argv) of one run: `bash recipes/cpu.sh OVERRIDES...`."""
    env = {**regime, "ALGO": run.arm.preset, "SEED": str(run.seed), "QUIET": "1", "COMPARE": "0"}
    return env, ["bash", str(recipe), *COMMON_OVERRIDES, *run.arm.overrides]


@contextlib.contextmanager
def holding(lock: str | None):
    """Hold an exclusive flock on `lock` (the one flock(1) takes) while the block runs; yields the seconds waited."""
    if lock is None:
        yield 0.0
        return
    began = time.time()
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield time.time() - began
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def shown(env: dict, argv: list[str], repo: Path) -> str:
    """The command as one shell line, with paths inside the repository relative to it."""
    def rel(text: str) -> str:
        path = Path(text)
        if path.is_absolute():
            try:
                return str(path.relative_to(repo))
            except ValueError:
                return text
        return text

    return " ".join([*(f"{k}={shlex.quote(rel(v))}" for k, v in env.items()), shlex.join(rel(a) for a in argv)])


def run_one(run: Run, results: Path, scratch: Path, regime: dict, recipe: Path, lock: str | None,
            python: str, timeout: float, log) -> bool:
    """Run one arm and seed in its scratch folder; on success copy metrics.jsonl and write run.json."""
    work = scratch / run.name
    if work.exists():  # an unfinished earlier attempt: start clean, so the JSONL holds this run only
        shutil.rmtree(work)
    work.mkdir(parents=True)
    env_add, argv = command_for(run, regime, recipe)
    env_add = {**env_add, "RUN_DIR": str(work)}
    # the recipe and verl's workers use this interpreter and its environment's tools, activated or not
    bin_dir = str(Path(python).parent)
    env = {**os.environ, **env_add, "PYTHON": python, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
    if (Path(bin_dir).parent / "pyvenv.cfg").is_file():
        env["VIRTUAL_ENV"] = str(Path(bin_dir).parent)
    env.pop("VERL_FILE_LOGGER_PATH", None)
    state = git_state(REPO)
    log(f"[study] {run.name}: {shown(env_add, argv, REPO)}")
    with holding(lock) as waited, open(work / "recipe.log", "w") as recipe_log:
        started = time.time()  # the run's own time: waiting for the lock is recorded apart
        try:
            proc = subprocess.run(argv, env=env, cwd=REPO, stdout=recipe_log, stderr=subprocess.STDOUT,
                                  timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        wall = time.time() - started
    steps = int(regime["STEPS"])
    reached = last_step(work / "metrics.jsonl")
    if code != 0 or (reached or 0) < steps:
        log(f"[study] {run.name}: FAILED (exit {code}, last logged step {reached}, {wall:.0f} s); log: "
            f"{work / 'console.log'} and {work / 'recipe.log'}")
        return False
    out = results / run.name
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / "metrics.jsonl", out / "metrics.jsonl")
    record = {
        "status": "finished",
        "arm": run.arm.name,
        "preset": run.arm.preset,
        "overrides": list(COMMON_OVERRIDES) + list(run.arm.overrides),
        "seed": run.seed,
        "regime": regime,
        "command": shown(env_add, argv, REPO),
        **state,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_s": round(wall, 1),
        "lock_wait_s": round(waited, 1),
        "python": sys.version.split()[0],
    }
    (out / "run.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    where = out.relative_to(results.parent) if results.parent in out.parents else out
    log(f"[study] {run.name}: done in {wall:.0f} s -> {where}")
    return True


def check_study(results: Path, regime: dict, study: str) -> None:
    """A study folder holds one regime: refuse to add runs of another one to it."""
    path = results / "study.json"
    if path.is_file():
        recorded = json.loads(path.read_text()).get("regime")
        if recorded != regime:
            raise StudyError(f"{path} records the regime {recorded}, not {regime}: use another --study")
    else:
        results.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"study": study, "regime": regime, "common_overrides": list(COMMON_OVERRIDES)},
                                   indent=2, sort_keys=True) + "\n")


def group_runs(results: Path) -> dict[str, list[Path]]:
    """The finished run folders of the study, per comparison of COMPARISONS that has runs of its own arms."""
    present = {p.name: p for p in sorted(results.iterdir()) if (p / "run.json").is_file()} if results.is_dir() else {}

    def folders(arm_names) -> list[Path]:
        return [path for path in present.values() if default_label(path / "metrics.jsonl") in arm_names]

    groups = {}
    for name, comparison in COMPARISONS.items():
        arms = [arm.name for arm in ARMS if arm.group == comparison.group]
        if folders(arms):
            groups[name] = folders([*comparison.beside, *arms])
    return groups


def compare(results: Path, python: str, log, plots: bool = True, out_root: Path | None = None) -> dict[str, Path]:
    """`tepo-verl compare` of each group of finished runs at STUDY_TARGET into out_root/<group> (default
    <results>/compare/<group>); returns group -> output folder."""
    written = {}
    for group, folders in group_runs(results).items():
        out = (out_root or results / "compare") / group
        argv = [python, "-m", "tepo_verl.report.compare", *map(str, folders), "--target", str(STUDY_TARGET),
                "--out", str(out), *([] if plots else ["--no-plots"])]
        if COMPARISONS[group].reference:
            argv += ["--reference", COMPARISONS[group].reference]
        log(f"[study] tepo-verl compare ({group}, {len(folders)} runs) -> {out}")
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            raise StudyError(f"tepo-verl compare failed for the {group} runs: {proc.stderr.strip()}")
        written[group] = out
    return written


def page_section(compared: dict[str, Path], page: Path) -> str:
    """The generated part of the results page: each comparison's compare.md and links to its plots."""
    lines = [PAGE_BEGIN, ""]
    for group, out in compared.items():
        lines += [f"#### {COMPARISONS[group].title}", ""]
        lines += [(out / "compare.md").read_text(encoding="utf-8").rstrip(), ""]
        for png in sorted(out.glob("*.png")):
            lines += [f"![{group}: {png.stem.replace('_', ' ')}]({os.path.relpath(png, page.parent)})", ""]
    return "\n".join([*lines, PAGE_END])


def write_page(results: Path, page: Path, python: str, log, plots: bool = True) -> None:
    """Regenerate the comparisons and splice them into `page` between PAGE_BEGIN and PAGE_END."""
    text = page.read_text(encoding="utf-8")
    if PAGE_BEGIN not in text or PAGE_END not in text:
        raise StudyError(f"{page} has no study markers: add the lines {PAGE_BEGIN!r} and {PAGE_END!r}")
    compared = compare(results, python, log, plots)
    if not compared:
        raise StudyError(f"no finished runs in {results}")
    head, _, rest = text.partition(PAGE_BEGIN)
    _, _, tail = rest.partition(PAGE_END)
    page.write_text(head + page_section(compared, page) + tail, encoding="utf-8")
    log(f"[study] wrote the study tables into {page}")


# --------------------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/study.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default=DEFAULT_STUDY, help=f"study name (default {DEFAULT_STUDY})")
    parser.add_argument("--arms", default="all", help="all (default), main, ablation or comma-separated arm names")
    parser.add_argument("--seeds", default=None,
                        help="e.g. 1-5 or 1,3 for every chosen arm (default: 1-5 for main arms, 1-3 for ablations)")
    parser.add_argument("--steps", type=int, default=int(REGIME["STEPS"]), help="training steps per run")
    parser.add_argument("--results-root", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--scratch-root", type=Path, default=REPO / "runs" / "study")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the recipe (default recipes/cpu.sh)")
    parser.add_argument("--lock", default=None,
                        help="hold an flock on this file during each run (a machine shared by others who use it)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run (default 1800)")
    parser.add_argument("--max-runs", type=int, default=None, help="stop after this many new runs")
    parser.add_argument("--list", action="store_true", help="print the plan and which runs are finished; run nothing")
    parser.add_argument("--no-compare", action="store_true", help="skip the comparisons and the page at the end")
    parser.add_argument("--page", action="store_true",
                        help="only regenerate the comparisons and the results page from the finished runs")
    parser.add_argument("--page-file", type=Path, default=REPO / "docs" / "results.md",
                        help="the results page (default docs/results.md)")
    parser.add_argument("--no-plots", action="store_true", help="comparisons without PNG plots")
    return parser


def main(argv: list[str] | None = None, log=print) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.steps < 1:
            raise StudyError(f"--steps must be >= 1, got {args.steps}")
        arms = select_arms(args.arms)
        check_presets(arms)
        runs = plan(arms, parse_seeds(args.seeds) if args.seeds else None)
        regime = {**REGIME, "STEPS": str(args.steps)}
        results = (args.results_root / args.study).resolve()
        scratch = (args.scratch_root / args.study).resolve()
        if args.list:
            log(f"study {args.study}: regime {regime}; verl overrides for every run: {' '.join(COMMON_OVERRIDES)}")
            for arm in arms:
                seeds = [r.seed for r in runs if r.arm is arm]
                done = [s for s in seeds if finished(results / f"{arm.name}-seed{s}", args.steps)]
                log(f"  {arm.name:20} {arm.group:8} preset {arm.preset:12} seeds {seeds} finished {done}  "
                    f"{' '.join(arm.overrides)}")
            return 0
        python = os.environ.get("PYTHON") or sys.executable
        if args.page:
            write_page(results, args.page_file, python, log, plots=not args.no_plots)
            return 0
        check_study(results, regime, args.study)
    except StudyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    todo = [run for run in runs if not finished(results / run.name, args.steps)]
    log(f"[study] {args.study}: {len(runs)} runs planned, {len(runs) - len(todo)} finished (skipped), "
        f"{len(todo)} to run; results in {results}")
    if args.max_runs is not None:
        todo = todo[: args.max_runs]
    failed = [run.name for run in todo
              if not run_one(run, results, scratch, regime, args.recipe.resolve(), args.lock, python, args.timeout,
                             log)]
    if failed:
        log(f"[study] {len(failed)} failed runs (rerun the same command to retry them): {', '.join(failed)}")
    if not args.no_compare:
        try:
            write_page(results, args.page_file, python, log, plots=not args.no_plots)
        except StudyError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
