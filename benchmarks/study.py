"""The CPU studies: arms x seeds through recipes/cpu.sh in the paper's regime, resumable, one folder per study.

    python benchmarks/study.py                          # every arm and seed of the current study (hours: resumable)
    python benchmarks/study.py --arms main --seeds 1-5  # the five main arms only
    python benchmarks/study.py --list                   # the plan: arms, overrides, seeds, regime; runs nothing
    python benchmarks/study.py --lock FILE ...          # hold an flock on FILE during each run (a shared machine)
    python benchmarks/study.py --page                   # regenerate every study's tables in docs/results.md

STUDIES holds each study: its regime (recipes/cpu.sh's environment for every run), its arms (a preset of
tepo_verl/config/algorithm/ plus verl overrides), seeds per arm group, the fixed target accuracy of "steps to
target", and the comparisons of its results page section. Every arm of one seed gets the same learning rate,
data order and seeds (recipes/cpu.sh's SEED), so runs pair by seed.

- `cpu-chain` (the current study, float32): the chain task (3 to 5 operands, 21-59-token responses, 256 validation
  problems sampled at temperature 1), pre-registered in docs/results.md before its first TEPO run. GRPO's seeds 1-5
  run first and are the test bed's check (`test_bed_passed`): no other run starts until they meet it. Its control
  arms take the KL coefficient that the dose arms select by the plan's rule (`control_coef`), so they run once those
  are finished.
- `cpu-chain-clipband`: the clip band's arms (tepo and gspo at 3e-2/4e-2), beside the float32 study's runs.
- `cpu-chain-collapse-calibration`: a search for a regime where entropy collapses, on grpo and tepo_nomask only:
  the runner picks each run from the finished ones by the calibration's procedure (collapse_state), not by seeds.
- `cpu-chain-collapse`: does the mask prevent that collapse? tepo and tepo_nomask (10 seeds) and grpo (5) in the
  regime the calibration met (calibrated_level), in its results folder; no arm exists before it has met one.
- `cpu-scratchpad` (superseded, bf16 log-probs): the first study, kept for its committed runs; no new runs.

Each finished run leaves, under benchmarks/results/<study>/<arm>-seed<k>/:
    metrics.jsonl.gz  verl's raw file-logger JSONL (one {"step", "data"} line per step and validation),
                      gzip-compressed with no timestamp (the same run gives the same bytes)
    run.json          the exact command, the git commit it ran at (and the tracked files that differed from it),
                      the arm, seed, preset, overrides, regime, wall time
A run is finished when both exist and the JSONL reaches the last step; the runner skips finished runs, so the
study can span sessions (commit the results folder as it fills). Every reader here, `tepo-verl compare` and
`tepo-verl doctor` take a run's metrics plain (metrics.jsonl) or compressed (tepo_verl.report.runs.metrics_file,
open_metrics). verl's console log, validation generations and the unfinished runs stay in runs/study/<study>/.
The last thing the runner does is write the results page: for each study, `tepo-verl compare` on each comparison's
runs at the study's target (into benchmarks/results/<study>/compare/<comparison>/), spliced into docs/results.md
between that study's markers.
The chain study's section opens with the plan's calls on its primary metric and its decisions for the defaults
(`plan_calls`, `plan_decisions`). A test checks that the committed page equals what the committed runs give.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import fcntl
import gzip
import io
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tepo_verl.report.compare import main as compare_main
from tepo_verl.report.runs import (
    GZIP_SUFFIX,
    METRICS_NAME,
    READ_ERRORS,
    RunError,
    default_label,
    metrics_file,
    open_metrics,
)
from tepo_verl.verl_adapter.precision import FLOAT32_OVERRIDES

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "cpu.sh"
PRESETS = REPO / "tepo_verl" / "config" / "algorithm"

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


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One generated table of the results page: the finished runs of the arms of `group`, with `beside` next to
    them, compared against `reference` (compare's --reference; None: its default, tepo)."""

    group: str
    title: str
    beside: tuple[str, ...] = ()
    reference: str | None = None


#: The plan's primary metric (docs/results.md, "Pre-registered analysis plan"), as `tepo-verl compare` names it.
PRIMARY = "val_auc"


@dataclasses.dataclass(frozen=True)
class Contrast:
    """One planned contrast of a study's primary metric: `reference` minus `arm`, paired by seed."""

    reference: str
    arm: str
    question: str  # what it answers, in a few words (the page's table)
    metric: str = PRIMARY  # a column of compare_runs.csv, or a metric per_seed derives from them


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    regime: dict[str, str]  # recipes/cpu.sh's environment for every run
    common_overrides: tuple[str, ...]  # verl overrides for every run, after the recipe's own
    arms: tuple[Arm, ...]
    seeds: dict[str, tuple[int, ...]]  # per arm group
    target: float  # the validation accuracy whose first crossing is "steps to target"
    comparisons: dict[str, Comparison]  # the page's tables, each by its folder under <results>/compare/
    superseded: str = ""  # why the study takes no new runs ("" while it is current)
    folder: str = ""  # its results folder under the results root ("": its name); studies of one regime share one
    contrasts: tuple[Contrast, ...] = ()  # the plan's contrasts, called with Holm's rule (CONTRAST_ALPHA) over them

    @property
    def results_name(self) -> str:
        return self.folder or self.name

    @property
    def page_begin(self) -> str:
        return f"<!-- {self.name} tables: generated by `python benchmarks/study.py --page` from the committed runs -->"

    @property
    def page_end(self) -> str:
        return f"<!-- end of the generated {self.name} tables -->"


# ---------------------------------------------------------------------------------- cpu-chain (current, float32)

#: The plan's rule for the control arms' KL coefficient (docs/results.md, "Pre-registered analysis plan"): the dose
#: level whose arm has the highest seed-mean validation AUC over these seeds; a tie goes to the smaller coefficient.
DOSE_LEVELS = {1.0: "tepo", 10.0: "tepo-kl10", 100.0: "tepo-kl100"}
DOSE_SEEDS = (1, 2, 3, 4, 5)
#: The test bed's own criterion (docs/results.md, its calibration), and the plan's gate: GRPO's seed-mean validation
#: accuracy at the last validation at least RISE_MIN above its value at step RISE_FROM. GRPO's seeds CHECK_SEEDS run
#: first, and no other run starts until they meet it.
RISE_ARM, RISE_FROM, RISE_MIN = "grpo", 20, 0.05
CHECK_SEEDS = (1, 2, 3, 4, 5)

CHAIN_ARMS = (
    Arm("tepo", "tepo", why="the default preset (mask surprisal_old, kl_coef 1, clip 3e-4/4e-4)"),
    Arm("tepo_nomask", "tepo_nomask", why="the mask off (kl_coef 0 in effect)"),
    Arm("gspo", "gspo", why="verl's GSPO loss (sequence ratio, sequence-mean aggregation)"),
    Arm("grpo", "grpo", why="GRPO with its KL loss to the reference"),
    Arm("dapo", "dapo", why="DAPO with dynamic sampling"),
    # the mask's dose: the same mask with a stronger penalty (1 is the tepo arm, 0 the tepo_nomask arm)
    Arm("tepo-kl10", "tepo", (f"{TEPO}.kl_coef=10.0",), "dose", "kl_coef 10"),
    Arm("tepo-kl100", "tepo", (f"{TEPO}.kl_coef=100.0",), "dose", "kl_coef 100"),
)
#: The controls: does the targeting matter? Our own variants, not the paper's; each at the coefficient the dose arms
#: select (control_coef), added to these overrides when the runs are planned.
CONTROL_TEMPLATES = (
    Arm("ctl-positive", "tepo", (f"{TEPO}.mask_rule=always",), "control",
        "the same KL on every token of positive-advantage responses, no entropy test"),
    Arm("ctl-every", "tepo", (f"{TEPO}.mask_rule=always", f"{TEPO}.mask_advantage=any"), "control",
        "the same KL on every valid token (undifferentiated)"),
    Arm("ctl-top20", "tepo", (f"{TEPO}.mask_top_frac=0.2",), "control",
        "the masked tokens with the top 20% of p(l + H) A (the largest first-order entropy drop)"),
)

CHAIN = Study(
    name="cpu-chain",
    regime={
        "TASK": "chain",       # 3-5 operands: responses of 21-59 tokens, reward on the final answer only
        "PRECISION": "float32",  # float32 log-probs, as verl's GPU paths hand the loss
        "N": "8",              # group size 8
        "BATCH": "32",         # prompts per step (256 responses): at 8 the curve is noise (docs/results.md)
        "MINI": "4",           # BATCH / 8: 8 PPO updates per step, one epoch
        "STEPS": "80",
        "TEST_FREQ": "4",      # validation on the 256 problems: 21 points with the one before training
    },
    # a validation's 256 problems decode in one batch, sampled at temperature 1 (mean@1: the policy's expected
    # reward, which keeps moving after the greedy answer has settled)
    common_overrides=("actor_rollout_ref.rollout.max_num_seqs=256", "trainer.total_epochs=20",
                      "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
                      "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"),
    arms=CHAIN_ARMS,
    seeds={"main": tuple(range(1, 11)), "dose": DOSE_SEEDS, "control": DOSE_SEEDS},
    target=0.28,  # the sampled start (0.172) plus about 4.5 standard errors of the 256-problem validation (the plan)
    comparisons={
        "main": Comparison("main", "Main arms (float32, 10 seeds)"),
        "dose": Comparison("dose", "The mask's dose: kl_coef 10 and 100 (with tepo, kl_coef 1, and tepo_nomask, 0)",
                           beside=("tepo", "tepo_nomask")),
        "control": Comparison("control", "Does the targeting matter? The controls at the selected coefficient",
                              beside=("tepo_nomask",)),
    },
)

# ------------------------------------------------------------- cpu-chain-clipband (the sequence ratio's clip band)

#: The clip band's wider level (GSPO's 3e-4/4e-4 times 100); the names the first study's ablations used.
WIDE_BAND = ("0.03", "0.04")
#: The clip band's question, pre-registered in docs/results.md ("The clip band"): is it the sequence ratio, or its
#: 3e-4/4e-4 clip band, that puts TEPO and GSPO behind GRPO on the chain test bed? Same regime, same seeds, beside
#: the float32 study's committed runs, which are its references.
CLIPBAND = Study(
    name="cpu-chain-clipband",
    folder=CHAIN.name,
    regime=CHAIN.regime,
    common_overrides=CHAIN.common_overrides,
    arms=(
        Arm("tepo-clip3e-2", "tepo", _clip(*WIDE_BAND), "clipband", "tepo with clip 3e-2/4e-2"),
        Arm("gspo-clip3e-2", "gspo", _clip(*WIDE_BAND), "clipband", "gspo with clip 3e-2/4e-2"),
    ),
    seeds={"clipband": tuple(range(1, 11))},
    target=CHAIN.target,
    comparisons={"clipband": Comparison("clipband", "The clip band: tepo and gspo at 3e-2/4e-2, with tepo, gspo "
                                                    "(3e-4/4e-4) and grpo beside them",
                                        beside=("tepo", "gspo", "grpo"), reference="tepo-clip3e-2")},
    contrasts=(
        Contrast("tepo-clip3e-2", "tepo", "widening the band, TEPO"),
        Contrast("gspo-clip3e-2", "gspo", "widening the band, GSPO"),
        Contrast("grpo", "tepo-clip3e-2", "GRPO's lead over TEPO at the wide band"),
        Contrast("grpo", "gspo-clip3e-2", "GRPO's lead over GSPO at the wide band"),
        Contrast("tepo-clip3e-2", "gspo-clip3e-2", "TEPO against GSPO at the wide band"),
    ),
)
#: The clip band's manipulation check: an arm's seed-mean clip fraction (actor/pg_clipfrac) below this means the
#: wide band unbound it.
UNBOUND_CLIP_FRACTION = 0.05
#: Holm's family-wise error rate over a study's contrasts.
CONTRAST_ALPHA = 0.05

# ------------------------------------------- cpu-chain-collapse-calibration (a regime where entropy collapses)

@dataclasses.dataclass(frozen=True)
class CollapseLevel:
    """One setting of the levers the calibration tries: verl overrides on top of the float32 study's regime."""

    name: str
    overrides: tuple[str, ...]
    why: str


#: The calibration's question, its criterion and its procedure are in docs/results.md ("Where entropy collapses:
#: the calibration"), committed before its first run. The levels, tried in this order; each on COLLAPSE_ARMS[0]
#: first, and on COLLAPSE_ARMS[1] only where the first met the criterion (a level must meet it on both).
COLLAPSE_LEVELS = (
    CollapseLevel("lr3e-4", (f"{ACTOR}.optim.lr=0.0003",),
                  "3x the learning rate (1e-4: entropy -12% in 80 steps; a probe at 1e-3 diverged at once)"),
    CollapseLevel("epochs4", (f"{ACTOR}.ppo_epochs=4",), "4 passes over each step's batch: 32 updates a step"),
    CollapseLevel("lr3e-4-epochs4", (f"{ACTOR}.optim.lr=0.0003", f"{ACTOR}.ppo_epochs=4"), "both levers"),
)
COLLAPSE_ARMS = ("grpo", "tepo_nomask")  # the arms without the mask; no arm with the mask runs in the calibration
COLLAPSE_SEED = 1
COLLAPSE_BUDGET = 6  # calibration runs at most
#: The criterion on each calibration arm: the token-mean entropy at the last step at most this share of the first
#: step's, after learning: the best validation accuracy at least RISE_MIN above the one before training (a policy
#: that never learned, as the 1e-3 probe, diverged rather than collapsed).
COLLAPSE_SHARE = 0.5


def collapse_arm(level: CollapseLevel, preset: str) -> str:
    """The calibration arm's name: its level, then its preset (`lr3e-4-grpo`)."""
    return f"{level.name}-{preset}"


COLLAPSE = Study(
    name="cpu-chain-collapse-calibration",
    regime=CHAIN.regime,
    common_overrides=CHAIN.common_overrides,
    arms=tuple(Arm(collapse_arm(level, preset), preset, level.overrides, "calibration", level.why)
               for level in COLLAPSE_LEVELS for preset in COLLAPSE_ARMS),
    seeds={"calibration": (COLLAPSE_SEED,)},
    target=CHAIN.target,
    comparisons={"calibration": Comparison("calibration", "The calibration runs (seed 1; grpo and tepo_nomask only)",
                                           reference=collapse_arm(COLLAPSE_LEVELS[0], COLLAPSE_ARMS[0]))},
)


# ------------------------------------- cpu-chain-collapse (does the mask prevent collapse? in the calibrated regime)

#: The comparison's plan is in docs/results.md ("Where entropy collapses: does the mask prevent it?"), committed before
#: the calibration's first run. Its arms take the level the calibration met (calibrated_level), so they exist only once
#: it has; their names are the calibration's (`lr3e-4-tepo_nomask`), in its results folder, so that the calibration's
#: seed-1 runs of grpo and tepo_nomask at that level are the comparison's seed 1 (the same command, the same seed).
MASK_ARMS = ("tepo", "tepo_nomask")  # the primary comparison: the mask, and the same loss with mask_rule=off
MASK_REFERENCE = "grpo"  # the token-ratio reference (secondary)
#: The plan's primary metrics, as per_seed names them: the entropy kept (entropy_end / entropy_start) and the area
#: under the validation curve.
RETENTION = "entropy_retention"

MASK_COLLAPSE = Study(
    name="cpu-chain-collapse",
    folder=COLLAPSE.results_name,
    regime=CHAIN.regime,
    common_overrides=CHAIN.common_overrides,
    arms=(),  # the calibrated level's (mask_collapse_study); none before the calibration has met one
    seeds={"collapse": tuple(range(1, 11)), "collapse-reference": (1, 2, 3, 4, 5)},
    target=CHAIN.target,
    comparisons={},
)


def calibrated_level(results: Path, steps: int) -> CollapseLevel | None:
    """The level the calibration met, as its procedure (collapse_state) walked the finished runs: the one whose runs
    on every COLLAPSE_ARMS met the criterion; None while there is none."""
    met = {check.run for check in collapse_state(results, steps)[1] if check.met}
    return next((level for level in COLLAPSE_LEVELS
                 if all(Run(Arm(collapse_arm(level, preset), preset), COLLAPSE_SEED).name in met
                        for preset in COLLAPSE_ARMS)),
                None)


def mask_collapse_study(level: CollapseLevel) -> Study:
    """The comparison in the regime of `level`: tepo and tepo_nomask at 10 seeds, grpo at 5, with its contrasts."""
    tepo, nomask, reference = (collapse_arm(level, preset) for preset in (*MASK_ARMS, MASK_REFERENCE))
    arms = (Arm(tepo, "tepo", level.overrides, "collapse", f"the mask, at {level.name}"),
            Arm(nomask, "tepo_nomask", level.overrides, "collapse", f"the mask off, at {level.name}"),
            Arm(reference, MASK_REFERENCE, level.overrides, "collapse-reference", f"the reference, at {level.name}"))
    return dataclasses.replace(
        MASK_COLLAPSE, arms=arms,
        comparisons={"collapse": Comparison("collapse", f"The mask where entropy collapses ({level.name}): tepo and "
                                                        "tepo_nomask, with grpo beside them",
                                            beside=(reference,), reference=tepo)},
        contrasts=(Contrast(tepo, nomask, "does the mask keep the entropy up", RETENTION),
                   Contrast(tepo, nomask, "does it learn better", PRIMARY)))


def resolved(study: Study, results_root: Path) -> Study:
    """`study` with the arms its results decide: the collapse comparison's from the calibrated level (unchanged
    while the calibration has met none)."""
    if study is not MASK_COLLAPSE:
        return study
    level = calibrated_level(results_root / study.results_name, int(study.regime["STEPS"]))
    return study if level is None else mask_collapse_study(level)


# ------------------------------------------------------------------------------ cpu-scratchpad (superseded, bf16)

SCRATCHPAD = Study(
    name="cpu-scratchpad",
    regime={"TASK": "scratchpad", "N": "8", "BATCH": "8", "MINI": "1", "STEPS": "80", "TEST_FREQ": "5"},
    common_overrides=("actor_rollout_ref.rollout.max_num_seqs=128", "trainer.total_epochs=20"),
    arms=(
        Arm("tepo", "tepo"), Arm("tepo_nomask", "tepo_nomask"), Arm("gspo", "gspo"), Arm("grpo", "grpo"),
        Arm("dapo", "dapo"),
        Arm("tepo-mask_surprisal", "tepo", (f"{TEPO}.mask_rule=surprisal", f"{ACTOR}.calculate_entropy=true"),
            "ablation", "mask rule l + H > 0"),
        Arm("tepo-mask_old", "tepo", (f"{TEPO}.mask_rule=old", f"{ACTOR}.calculate_entropy=true"),
            "ablation", "mask rule H < H_old (the literal reading)"),
        Arm("tepo-kl0.1", "tepo", (f"{TEPO}.kl_coef=0.1",), "ablation", "kl_coef 0.1"),
        Arm("tepo-kl10", "tepo", (f"{TEPO}.kl_coef=10.0",), "ablation", "kl_coef 10"),
        Arm("tepo-clip3e-3", "tepo", _clip("0.003", "0.004"), "ablation", "clip 3e-3/4e-3"),
        Arm("tepo-clip3e-2", "tepo", _clip("0.03", "0.04"), "ablation", "clip 3e-2/4e-2"),
        Arm("gspo-clip3e-3", "gspo", _clip("0.003", "0.004"), "ablation", "clip 3e-3/4e-3"),
        Arm("gspo-clip3e-2", "gspo", _clip("0.03", "0.04"), "ablation", "clip 3e-2/4e-2"),
        Arm("tepo_nomask-seqmean", "tepo_nomask", (f"{ACTOR}.loss_agg_mode=seq-mean-token-mean",), "ablation",
            "GSPO's seq-mean-token-mean aggregation (with the mask off, GSPO's loss)"),
        Arm("tepo-fp32", "tepo", FLOAT32_OVERRIDES, "precision", "float32 actor and log-probs"),
        Arm("gspo-fp32", "gspo", FLOAT32_OVERRIDES, "precision", "float32 actor and log-probs"),
    ),
    seeds={"main": (1, 2, 3, 4, 5), "ablation": (1, 2), "precision": (1, 2, 3, 4, 5)},
    target=0.65,  # fixed after one run (tepo seed 1, best 0.727) and before any other arm had run
    comparisons={
        "main": Comparison("main", "Main arms"),
        "ablations": Comparison("ablation", "TEPO ablations (with the tepo, tepo_nomask and gspo arms beside them)",
                                beside=("tepo", "tepo_nomask", "gspo")),
        "precision": Comparison("precision",
                                "Float32 log-probs (tepo-fp32 against gspo-fp32, with the bf16 tepo and gspo arms)",
                                beside=("tepo", "gspo"), reference="tepo-fp32"),
    },
    superseded="its runs computed the actor in bf16 (verl's CPU default then); the float32 study cpu-chain "
               "replaces it, and its committed runs stay for the page",
)

STUDIES = {study.name: study for study in (CHAIN, CLIPBAND, COLLAPSE, MASK_COLLAPSE, SCRATCHPAD)}
DEFAULT_STUDY = CHAIN.name


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


def control_coef(results: Path, steps: int) -> float | None:
    """The KL coefficient of the control arms by the plan's rule (DOSE_LEVELS, DOSE_SEEDS), from the finished
    dose runs in `results`; None while any of them is unfinished."""
    from tepo_verl.report.compare import val_auc
    from tepo_verl.report.runs import load_runs

    means = {}
    for coef, arm in DOSE_LEVELS.items():
        folders = [results / f"{arm}-seed{seed}" for seed in DOSE_SEEDS]
        if not all(finished(folder, steps) for folder in folders):
            return None
        aucs = [val_auc(run.val_accuracy()) for run in load_runs([str(metrics_file(f)) for f in folders])]
        means[coef] = sum(aucs) / len(aucs)
    best = max(means.values())
    return min(coef for coef, mean in means.items() if mean == best)


def grpo_rise(results: Path, steps: int, seeds: tuple[int, ...] | None = None) -> tuple[int, float, float] | None:
    """(runs, seed-mean validation accuracy at RISE_FROM, at `steps`) over the finished RISE_ARM runs in `results`
    (of `seeds` only, when given: None until all of them are finished; else None when none is)."""
    from tepo_verl.report.runs import load_runs

    if seeds is not None:
        folders = [results / f"{RISE_ARM}-seed{seed}" for seed in seeds]
        if not all(finished(folder, steps) for folder in folders):
            return None
    else:
        folders = [path for path in sorted(results.glob(f"{RISE_ARM}-seed*")) if finished(path, steps)]
        if not folders:
            return None
    curves = [dict(run.val_accuracy()) for run in load_runs([str(metrics_file(f)) for f in folders])]
    missing = [f.name for f, curve in zip(folders, curves) if RISE_FROM not in curve or steps not in curve]
    if missing:
        raise StudyError(f"no validation at step {RISE_FROM} or {steps} in {', '.join(missing)}")
    at_from, at_last = (sum(curve[step] for curve in curves) / len(curves) for step in (RISE_FROM, steps))
    return len(curves), at_from, at_last


def test_bed_passed(results: Path, steps: int) -> bool | None:
    """The plan's gate: GRPO's seeds CHECK_SEEDS rise by at least RISE_MIN from step RISE_FROM to the last
    validation (None while any of them is unfinished)."""
    rise = grpo_rise(results, steps, CHECK_SEEDS)
    return None if rise is None else rise[2] - rise[1] >= RISE_MIN


def gate_state(results: Path, steps: int) -> str:
    """The test bed's check in words: pending (how many of its runs are finished), passed or failed, with the rise."""
    rise = grpo_rise(results, steps, CHECK_SEEDS)
    if rise is None:
        done = sum(finished(results / f"{RISE_ARM}-seed{seed}", steps) for seed in CHECK_SEEDS)
        return f"pending, {done} of {len(CHECK_SEEDS)} runs finished"
    gain = rise[2] - rise[1]
    return f"{'passed' if gain >= RISE_MIN else 'failed'}, {gain:+.3f} from step {RISE_FROM} to step {steps}"


@dataclasses.dataclass(frozen=True)
class CollapseCheck:
    """The collapse calibration's criterion (COLLAPSE_SHARE, RISE_MIN) on one finished run."""

    run: str
    entropy_first: float  # token-mean entropy (ENTROPY) at the first training step
    entropy_last: float  # ... at the last
    val_start: float  # validation accuracy before training
    val_best: float

    @property
    def collapsed(self) -> bool:
        return self.entropy_last <= COLLAPSE_SHARE * self.entropy_first

    @property
    def learned(self) -> bool:
        return self.val_best - self.val_start >= RISE_MIN

    @property
    def met(self) -> bool:
        return self.collapsed and self.learned


def collapse_check(folder: Path, steps: int) -> CollapseCheck:
    """The criterion on the finished calibration run in `folder`."""
    from tepo_verl.report.runs import ENTROPY, load_run

    run = load_run(metrics_file(folder))
    entropy, accuracy = dict(run.series(ENTROPY)), dict(run.val_accuracy())
    if steps not in entropy or 0 not in accuracy:
        raise StudyError(f"{folder.name}: no {ENTROPY} at step {steps} or no validation at step 0 in its metrics")
    return CollapseCheck(folder.name, entropy[min(entropy)], entropy[steps], accuracy[0], max(accuracy.values()))


def collapse_state(results: Path, steps: int) -> tuple[Run | None, list[CollapseCheck], str]:
    """The calibration's procedure (docs/results.md) on the finished runs in `results`: the levels in order, each
    on COLLAPSE_ARMS in order, a level left as soon as an arm misses the criterion, the first level that meets it on
    every arm the regime, at most COLLAPSE_BUDGET runs. Returns the next run (None once the calibration is over),
    the checks of the finished runs in that order, and the state in words."""
    arms = {arm.name: arm for arm in COLLAPSE.arms}
    checks: list[CollapseCheck] = []
    for level in COLLAPSE_LEVELS:
        for preset in COLLAPSE_ARMS:
            run = Run(arms[collapse_arm(level, preset)], COLLAPSE_SEED)
            if not finished(results / run.name, steps):
                if len(checks) >= COLLAPSE_BUDGET:
                    return None, checks, (f"not reached: no level met the criterion within the budget of "
                                          f"{COLLAPSE_BUDGET} runs")
                return run, checks, f"in progress, {len(checks)} of at most {COLLAPSE_BUDGET} runs; next {run.name}"
            checks.append(collapse_check(results / run.name, steps))
            if not checks[-1].met:
                break
        else:
            return None, checks, f"calibrated: level {level.name} met the criterion on {' and '.join(COLLAPSE_ARMS)}"
    return None, checks, f"not reached: none of the {len(COLLAPSE_LEVELS)} levels met the criterion"


def collapse_section(results: Path, steps: int) -> list[str]:
    """The page's account of the calibration: its state, and the criterion on each finished run."""
    _, checks, state = collapse_state(results, steps)
    lines = [f"**The calibration** (a level meets the criterion on a run when its token-mean entropy at step {steps} "
             f"is at most {COLLAPSE_SHARE:g} of step 1's and its best validation accuracy is at least {RISE_MIN:g} "
             f"above step 0's): {state}.", "",
             f"| run | entropy, step 1 | entropy, step {steps} | share | validation, step 0 | best | criterion |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {c.run} | {c.entropy_first:.4f} | {c.entropy_last:.4f} | {c.entropy_last / c.entropy_first:.3f} | "
              f"{c.val_start:.4f} | {c.val_best:.4f} | {'met' if c.met else 'missed'} |" for c in checks]
    return [*lines, ""]


def control_arms(coef: float) -> tuple[Arm, ...]:
    """The control arms at KL coefficient `coef`."""
    return tuple(dataclasses.replace(arm, overrides=(*arm.overrides, f"{TEPO}.kl_coef={coef}"))
                 for arm in CONTROL_TEMPLATES)


def study_arms(study: Study, coef: float | None) -> tuple[Arm, ...]:
    """Every arm of `study`; the chain study's controls only once their coefficient is known."""
    controls = control_arms(coef) if (study is CHAIN and coef is not None) else ()
    return (*study.arms, *controls)


def select_arms(text: str, arms: tuple[Arm, ...], groups) -> list[Arm]:
    """`all`, a group name (main, dose, ...), or comma-separated arm names (groups may be mixed in)."""
    by_name = {arm.name: arm for arm in arms}
    chosen: list[Arm] = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        if part == "all":
            chosen.extend(arms)
        elif part in groups:
            chosen.extend(arm for arm in arms if arm.group == part)
        elif part in by_name:
            chosen.append(by_name[part])
        else:
            raise StudyError(f"unknown arm {part!r}; valid: all, {', '.join(groups)}, {', '.join(by_name)}")
    if not chosen:
        raise StudyError(f"--arms {text!r} names no arm")
    return list({arm.name: arm for arm in chosen}.values())


def gate_run(run: Run, study: Study) -> bool:
    """One of the runs of the chain study's gate (GRPO's seeds CHECK_SEEDS), which run before every other."""
    return study is CHAIN and run.arm.name == RISE_ARM and run.seed in CHECK_SEEDS


def plan(arms: list[Arm], seeds: tuple[int, ...] | None, study: Study) -> list[Run]:
    """Seed-major order (every arm of seed 1, then seed 2, ...), so a study stopped early stays paired by seed;
    the chain study's gate runs first; the control arms after every other arm's run of their seeds (their
    coefficient comes from the dose arms)."""
    per_arm = {arm.name: (seeds or study.seeds[arm.group]) for arm in arms}
    every = sorted({seed for values in per_arm.values() for seed in values})
    runs = [Run(arm, seed) for seed in every for arm in arms if seed in per_arm[arm.name]]

    def phase(run: Run) -> int:  # the gate; main and dose arms' seeds 1-5; the controls; the main arms' later seeds
        if gate_run(run, study):
            return 0
        if run.arm.group == "control":
            return 2
        return 1 if run.seed <= max(DOSE_SEEDS) else 3

    return sorted(runs, key=phase)  # stable: seed-major within each phase


def check_presets(arms) -> None:
    for arm in arms:
        if not (PRESETS / f"{arm.preset}.yaml").is_file():
            raise StudyError(f"arm {arm.name}: no preset {arm.preset!r} in {PRESETS}")


# ------------------------------------------------------------------------------------------------ the runs

def last_step(jsonl: Path) -> int | None:
    """The largest step of a file-logger JSONL, plain or compressed (None when absent, empty or unreadable)."""
    try:
        with open_metrics(jsonl) as handle:
            steps = [int(json.loads(line)["step"]) for line in handle if line.strip()]
    except (ValueError, KeyError, TypeError, *READ_ERRORS):
        return None
    return max(steps) if steps else None


def finished(run_dir: Path, steps: int) -> bool:
    """The metrics file (metrics_file) reaches the last step and run.json records a finished run of this many
    steps."""
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return (record.get("status") == "finished" and int(record.get("regime", {}).get("STEPS", -1)) == steps
            and (last_step(metrics_file(run_dir)) or 0) >= steps)


def git_state(repo: Path) -> dict:
    """The commit HEAD points at and the tracked files that differ from it (so a record says what ran)."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return out.stdout if out.returncode == 0 else ""

    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line[3:]]
    return {"commit": git("rev-parse", "HEAD").strip() or None, "changed_tracked_files": changed}


def command_for(run: Run, regime: dict, recipe: Path, study: Study) -> tuple[dict, list[str]]:
    """(environment additions, argv) of one run: `bash recipes/cpu.sh OVERRIDES...`."""
    env = {**regime, "ALGO": run.arm.preset, "SEED": str(run.seed), "QUIET": "1", "COMPARE": "0"}
    return env, ["bash", str(recipe), *study.common_overrides, *run.arm.overrides]


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


def run_recipe(argv: list[str], env: dict, log_file, timeout: float) -> int | str:
    """Run the recipe in a process group of its own; its exit code, or "timeout" once the whole group (the recipe,
    verl's driver and every Ray and vLLM process it started) is killed: a run cut short leaves nothing running
    beside the next one."""
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # also the group's strays after a normal exit
        proc.wait()


def run_one(run: Run, results: Path, scratch: Path, regime: dict, recipe: Path, lock: str | None,
            python: str, timeout: float, log, study: Study) -> bool:
    """Run one arm and seed in its scratch folder; on success store its metrics compressed (store_metrics) and
    write run.json."""
    work = scratch / run.name
    if work.exists():  # an unfinished earlier attempt: start clean, so the JSONL holds this run only
        shutil.rmtree(work)
    work.mkdir(parents=True)
    env_add, argv = command_for(run, regime, recipe, study)
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
        code = run_recipe(argv, env, recipe_log, timeout)
        wall = time.time() - started
    steps = int(regime["STEPS"])
    reached = last_step(metrics_file(work))
    if code != 0 or (reached or 0) < steps:
        log(f"[study] {run.name}: FAILED (exit {code}, last logged step {reached}, {wall:.0f} s); log: "
            f"{work / 'console.log'} and {work / 'recipe.log'}")
        return False
    out = results / run.name
    out.mkdir(parents=True, exist_ok=True)
    store_metrics(metrics_file(work), out)
    record = {
        "status": "finished",
        "arm": run.arm.name,
        "preset": run.arm.preset,
        "overrides": list(study.common_overrides) + list(run.arm.overrides),
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


def store_metrics(source: Path, out: Path) -> Path:
    """Write the metrics file `source` into the run folder `out` as metrics.jsonl.gz, with mtime 0 in the gzip
    header so that the same metrics give the same bytes; a plain metrics.jsonl left there by an earlier run of the
    same arm and seed goes (a folder holds one metrics file)."""
    target = out / (METRICS_NAME + GZIP_SUFFIX)
    target.write_bytes(gzip.compress(source.read_bytes(), mtime=0))
    (out / METRICS_NAME).unlink(missing_ok=True)
    return target


def check_study(results: Path, regime: dict, study: Study) -> None:
    """A study folder holds one regime: refuse to add runs of another one to it."""
    path = results / "study.json"
    if path.is_file():
        recorded = json.loads(path.read_text()).get("regime")
        if recorded != regime:
            raise StudyError(f"{path} records the regime {recorded}, not {regime}: use another --results-root")
    else:
        results.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"study": study.name, "regime": regime,
                                    "common_overrides": list(study.common_overrides)},
                                   indent=2, sort_keys=True) + "\n")


def group_runs(results: Path, study: Study) -> dict[str, tuple[Comparison, list[Path]]]:
    """The finished run folders of the study, per comparison that has runs of its own arms (the chain study's
    control comparison sets the dose arm of the selected coefficient beside the controls, as its reference)."""
    present = {p.name: p for p in sorted(results.iterdir()) if (p / "run.json").is_file()} if results.is_dir() else {}

    if study is COLLAPSE:  # its arms' later seeds are the collapse comparison's, in the same folder
        present = {name: path for name, path in present.items() if name.endswith(f"-seed{COLLAPSE_SEED}")}

    def folders(arm_names) -> list[Path]:
        return [path for path in present.values() if default_label(metrics_file(path)) in arm_names]

    coef = control_coef(results, int(study.regime["STEPS"])) if study is CHAIN else None
    arms = study_arms(study, coef)
    groups = {}
    for name, comparison in study.comparisons.items():
        own = [arm.name for arm in arms if arm.group == comparison.group]
        if comparison.group == "control":
            if coef is None:
                continue
            comparison = dataclasses.replace(comparison, beside=(DOSE_LEVELS[coef], *comparison.beside),
                                             reference=DOSE_LEVELS[coef])
        if folders(own):
            groups[name] = (comparison, folders([*comparison.beside, *own]))
    return groups


def in_repo(path: Path) -> str:
    """PATH relative to the repository when it is inside it (what the committed tables record), else absolute."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def compare(results: Path, study: Study, log, plots: bool = True,
            out_root: Path | None = None) -> dict[str, tuple[Comparison, Path]]:
    """`tepo-verl compare` of each comparison's finished runs at the study's target into out_root/<comparison>
    (default <results>/compare/<comparison>); returns comparison -> (its definition, output folder). The command's
    own entry point, called in this process (its printout is not shown; its error line ends the study)."""
    written = {}
    for name, (comparison, folders) in group_runs(results, study).items():
        out = (out_root or results / "compare") / name
        argv = [*map(in_repo, folders), "--target", str(study.target), "--out", in_repo(out),
                *([] if plots else ["--no-plots"])]
        if comparison.reference:
            argv += ["--reference", comparison.reference]
        log(f"[study] tepo-verl compare ({study.name} {name}, {len(folders)} runs) -> {out}")
        printed, errors, cwd = io.StringIO(), io.StringIO(), os.getcwd()
        os.chdir(REPO)  # the folders as the repository names them, as the committed tables record them
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
                code = compare_main(argv)
        finally:
            os.chdir(cwd)
        if code != 0:
            raise StudyError(f"tepo-verl compare failed for the {study.name} {name} runs: {errors.getvalue().strip()}")
        written[name] = (comparison, out)
    return written


def rise_check(results: Path, study: Study) -> str | None:
    """The page's line on the test bed's criterion, from every finished RISE_ARM run (None: none finished yet)."""
    rise = grpo_rise(results, int(study.regime["STEPS"]))
    if rise is None:
        return None
    seeds, at_from, at_last = rise
    verdict = "meets" if at_last - at_from >= RISE_MIN else "does not meet"
    return (f"**The test bed's check** ({RISE_ARM}, {seeds} of {len(study.seeds['main'])} seeds): the seed-mean "
            f"validation accuracy is {at_from:.3f} at step {RISE_FROM} and {at_last:.3f} at step "
            f"{study.regime['STEPS']}, {at_last - at_from:+.3f}, which {verdict} the calibration's +{RISE_MIN:.2f}.")


@dataclasses.dataclass(frozen=True)
class Call:
    """One comparison of the primary metric by the plan's statistics: `reference` minus `arm`, paired by seed."""

    reference: str
    arm: str
    differences: tuple[float, ...]  # per paired seed
    planned: int  # the pairs the plan gives this comparison
    mean: float
    low: float  # the 95% bootstrap interval of the mean
    high: float
    p: float  # two-sided sign-flip

    @property
    def word(self) -> str:
        """pending (fewer pairs than planned); with 10 pairs supported (p < 0.05, interval excludes 0) or null;
        with 5, consistent (every seed the same sign, interval excludes 0) or null."""
        if len(self.differences) < self.planned:
            return "pending"
        excludes_zero = self.low > 0 or self.high < 0
        if self.planned >= 10:
            return "supported" if self.p < 0.05 and excludes_zero else "null"
        same_sign = all(d > 0 for d in self.differences) or all(d < 0 for d in self.differences)
        return "consistent" if same_sign and excludes_zero else "null"

    @property
    def ahead(self) -> str:
        """Whose primary metric is the higher where the call is supported or consistent (`reference` or `arm`);
        "-" for a null or a pending call."""
        if self.word not in ("supported", "consistent"):
            return "-"
        return self.reference if self.mean > 0 else self.arm

    @property
    def favours_arm(self) -> bool:
        """A supported or consistent difference in the arm's favour (its primary metric the higher)."""
        return self.ahead == self.arm


def plan_calls(compared: dict[str, tuple[Comparison, Path]], study: Study) -> dict[str, list[Call]]:
    """Per comparison: the plan's call on the primary metric for each of its own arms against its reference, from
    the comparison's compare_runs.csv (the per-seed values) and compare_paired.csv (mean, interval, p)."""
    from tepo_verl.report.compare import default_reference

    calls = {}
    for name, (comparison, out) in compared.items():
        runs = list(csv.DictReader((out / "compare_runs.csv").open(encoding="utf-8")))
        reference = comparison.reference or default_reference(row["algorithm"] for row in runs)  # as compare chose
        values = {(row["algorithm"], row["seed"]): float(row[PRIMARY]) for row in runs if row[PRIMARY] and row["seed"]}
        own = [arm.name for arm in (*study.arms, *CONTROL_TEMPLATES) if arm.group == comparison.group]
        calls[name] = []
        for row in csv.DictReader((out / "compare_paired.csv").open(encoding="utf-8")):
            if row["metric"] != PRIMARY or row["baseline"] not in own:
                continue
            seeds = row["seeds"].split()
            calls[name].append(Call(
                reference, row["baseline"],
                tuple(values[(reference, s)] - values[(row["baseline"], s)] for s in seeds),
                len(study.seeds[comparison.group]), float(row["mean_difference"]),
                *(float(row[k]) if row[k] else float("nan") for k in ("ci_low", "ci_high", "p_value"))))
    return calls


def plan_decisions(calls: dict[str, list[Call]]) -> list[str]:
    """The plan's decision rules for the defaults, applied to its calls: one line each."""
    def interval(call: Call) -> str:
        return f"{call.mean:+.4f} [{call.low:+.4f}, {call.high:+.4f}], p = {call.p:.3g}"

    main = {call.arm: call for call in calls.get("main", [])}
    mask = main.get("tepo_nomask")
    if mask is None or mask.word == "pending":
        lines = ["- **The mask's benefit** (`tepo` against `tepo_nomask`): pending."]
    elif mask.word == "null":
        lines = [f"- **The mask's benefit is not established on this test bed** (`tepo` minus `tepo_nomask`: "
                 f"{interval(mask)}); the defaults stay."]
    else:
        lines = [f"- **The mask's benefit** (`tepo` minus `tepo_nomask`): {mask.word}, {interval(mask)}."]
    dose = calls.get("dose", [])
    if len(dose) < len(DOSE_LEVELS) - 1 or any(call.word == "pending" for call in dose):
        lines.append("- **`kl_coef`**: pending (the dose arms' seeds 1-5).")
    else:
        winners = sorted((call for call in dose if call.favours_arm), key=lambda call: call.mean)
        coef = {arm: coef for coef, arm in DOSE_LEVELS.items()}
        lines.append(f"- **`kl_coef`** changes to {coef[winners[0].arm]:g} (`tepo` minus `{winners[0].arm}`: "
                     f"{interval(winners[0])})."
                     if winners else "- **`kl_coef`** stays 1: no dose arm beats `tepo` on all 5 paired seeds with "
                     "an interval that excludes 0.")
    control = calls.get("control", [])
    if len(control) < len(CONTROL_TEMPLATES) or any(call.word == "pending" for call in control):
        lines.append("- **The mask's selection**: pending (the controls' seeds 1-5).")
    else:
        winners = [call.arm for call in control if call.favours_arm]
        if not winners:
            lines.append("- **The mask's selection** stays: no control beats the dose arm at its coefficient on all "
                         "5 paired seeds with an interval that excludes 0.")
        elif len(winners) == 1:
            lines.append(f"- **The mask's selection**: changes to `{winners[0]}`'s.")
        else:
            lines.append(f"- **The mask's selection**: {', '.join(winners)} each qualify; the plan names no rule "
                         "between them, so the default stays until one is chosen on other evidence.")
    return lines


def calls_section(calls: dict[str, list[Call]]) -> list[str]:
    """The page's table of the plan's calls on the primary metric, then its decisions for the defaults."""
    lines = [f"**The plan's calls** on the primary metric ({PRIMARY}, reference minus arm, paired by seed; pending "
             "until a comparison has its planned pairs; ahead: whose metric is the higher, where the call is "
             "supported or consistent):", "",
             "| reference | arm | pairs | mean difference | 95% interval | p | call | ahead |",
             "|---|---|---|---|---|---|---|---|"]
    for call in (call for group in calls.values() for call in group):
        shown = "nan" if math.isnan(call.low) else f"[{call.low:+.4f}, {call.high:+.4f}]"
        lines.append(f"| {call.reference} | {call.arm} | {len(call.differences)} of {call.planned} | "
                     f"{call.mean:+.4f} | {shown} | {call.p:.3g} | {call.word} | {call.ahead} |")
    return [*lines, "", "**The plan's decisions** for the defaults:", "", *plan_decisions(calls), ""]


# ------------------------------------------------------------------------------ contrasts (Holm over the family)

def holm_rejections(p_values: list[float], alpha: float = CONTRAST_ALPHA) -> list[bool]:
    """Holm's step-down rule: the k-th smallest p (k = 1..m) is rejected while every smaller one was and it is at
    most alpha / (m - k + 1). NaN is never rejected. The family-wise error rate is at most alpha."""
    order = sorted(range(len(p_values)), key=lambda i: (math.isnan(p_values[i]), p_values[i]))
    rejected = [False] * len(p_values)
    for rank, index in enumerate(order):
        if math.isnan(p_values[index]) or p_values[index] > alpha / (len(p_values) - rank):
            break
        rejected[index] = True
    return rejected


@dataclasses.dataclass(frozen=True)
class ContrastCall:
    """A planned contrast on the primary metric, by the plan's statistics and Holm's rule over its family."""

    contrast: Contrast
    differences: tuple[float, ...]  # per paired seed, reference minus arm
    planned: int
    mean: float
    low: float  # 95% bootstrap interval of the mean
    high: float
    p: float  # two-sided exact sign-flip, unadjusted
    holm: bool  # rejected by Holm's rule over the family
    family_complete: bool  # every contrast of the family has its planned pairs (the calls are made then, at once)

    @property
    def word(self) -> str:
        """pending (the family is not complete), supported (Holm rejects and the interval excludes 0) or null."""
        if not self.family_complete:
            return "pending"
        return "supported" if self.holm and (self.low > 0 or self.high < 0) else "null"

    @property
    def ahead(self) -> str:
        if self.word != "supported":
            return "-"
        return self.contrast.reference if self.mean > 0 else self.contrast.arm


#: Metrics per_seed derives from compare_runs.csv's columns: the entropy kept, entropy_end over entropy_start.
DERIVED = {RETENTION: lambda row: float(row["entropy_end"]) / float(row["entropy_start"])
           if row["entropy_end"] and row["entropy_start"] else None}


def per_seed(out: Path, metric: str = PRIMARY) -> dict[str, dict[int, float]]:
    """arm -> seed -> `metric` (a column of a comparison's compare_runs.csv, or one of DERIVED from its columns)."""
    values: dict[str, dict[int, float]] = {}
    for row in csv.DictReader((out / "compare_runs.csv").open(encoding="utf-8")):
        value = DERIVED[metric](row) if metric in DERIVED else (float(row[metric]) if row[metric] else None)
        if value is not None and row["seed"]:
            values.setdefault(row["algorithm"], {})[int(float(row["seed"]))] = value
    return values


def contrast_calls(values: dict[str, dict[str, dict[int, float]]], study: Study) -> list[ContrastCall]:
    """Each of the study's contrasts over the seeds both arms ran, with Holm's rule over the family; `values` is
    metric -> arm -> seed -> value (per_seed)."""
    from tepo_verl.report.compare import bootstrap_ci, mean_of, sign_flip_p

    planned = len(next(iter(study.seeds.values())))
    parts = []
    for contrast in study.contrasts:
        of_metric = values.get(contrast.metric, {})
        ref, arm = of_metric.get(contrast.reference, {}), of_metric.get(contrast.arm, {})
        differences = tuple(ref[seed] - arm[seed] for seed in sorted(set(ref) & set(arm)))
        parts.append((contrast, differences, mean_of(differences), *bootstrap_ci(differences),
                      sign_flip_p(differences)))
    complete = all(len(part[1]) >= planned for part in parts)
    rejected = holm_rejections([part[-1] for part in parts]) if complete else [False] * len(parts)
    return [ContrastCall(contrast, differences, planned, mean, low, high, p, holm, complete)
            for (contrast, differences, mean, low, high, p), holm in zip(parts, rejected, strict=True)]


def clip_fractions(out: Path, arms) -> dict[str, float]:
    """The seed-mean clip fraction (compare's clip_fraction: actor/pg_clipfrac over the steps) of each of `arms`."""
    values = per_seed(out, "clip_fraction")
    return {arm: sum(values[arm].values()) / len(values[arm]) for arm in arms if values.get(arm)}


def contrast_text(call: ContrastCall) -> str:
    """A call as the decisions quote it: the difference, its interval, p and the call."""
    return (f"`{call.contrast.reference}` minus `{call.contrast.arm}`: {call.mean:+.4f} [{call.low:+.4f}, "
            f"{call.high:+.4f}], p = {call.p:.3g}, {call.word}")


def pending_line(calls: list[ContrastCall]) -> list[str]:
    done = min(len(call.differences) for call in calls)
    return [f"- **Pending**: {done} of {calls[0].planned} paired seeds in every contrast; the calls are made on all "
            "of them at once (Holm's rule is over the family)."]


def clip_band_decisions(calls: list[ContrastCall], values: dict[str, dict[int, float]],
                        fractions: dict[str, float]) -> list[str]:
    """The clip band plan's decision rule for each sequence-ratio loss, and its reading of TEPO against GSPO."""
    by_pair = {(c.contrast.reference, c.contrast.arm): c for c in calls}
    if any(call.word == "pending" for call in calls):
        return pending_line(calls)
    lines = []
    for loss in ("tepo", "gspo"):
        wide = f"{loss}-clip3e-2"
        widening, lead = by_pair[(wide, loss)], by_pair[("grpo", wide)]
        seeds = sorted(set(values["grpo"]) & set(values[loss]))
        gap = sum(values["grpo"][s] - values[loss][s] for s in seeds) / len(seeds)
        unbound = fractions.get(wide, math.inf) < UNBOUND_CLIP_FRACTION
        band = ("the wide band unbound it" if unbound else
                f"the wide band did not unbind it (clip fraction {fractions.get(wide, math.nan):.3f}, not below "
                f"{UNBOUND_CLIP_FRACTION})")
        if widening.word == "supported" and widening.mean > 0:
            if lead.word == "null" and lead.high < gap / 2:
                verdict = f"**The band explains GRPO's lead over `{loss}`** on this test bed"
            else:
                verdict = f"**Widening the band helps `{loss}`, and GRPO's lead is not explained by it alone**"
        elif widening.word == "supported":
            verdict = f"**Widening the band hurts `{loss}`**"
        else:
            verdict = f"**Widening the band is not shown to help `{loss}`**"
        lines.append(f"- {verdict} ({band}): {contrast_text(widening)}; {contrast_text(lead)}, against "
                     f"today's gap of {gap:+.4f} (`grpo` minus `{loss}` at 3e-4/4e-4, half of it {gap / 2:+.4f}).")
    versus = by_pair[("tepo-clip3e-2", "gspo-clip3e-2")]
    lines.append(f"- **TEPO against GSPO at the wide band** ({contrast_text(versus)}): "
                 + (f"`{versus.ahead}` ahead." if versus.word == "supported" else "not shown to differ."))
    lines.append("- No preset value changes, whatever the calls: the documentation of the `tepo`, `tepo_nomask` and "
                 "`gspo` presets quotes these lines.")
    return lines


def mask_collapse_decisions(calls: list[ContrastCall]) -> list[str]:
    """The collapse comparison plan's decision rule on its two contrasts (entropy kept, then val_auc; `tepo` minus
    `tepo_nomask`, so a positive difference is in the mask's favour)."""
    if any(call.word == "pending" for call in calls):
        return pending_line(calls)
    keep, learn = calls
    favours = {call: call.word == "supported" and call.mean > 0 for call in calls}
    if learn.word == "supported" and learn.mean < 0:
        verdict = "**The mask hurts learning there**"
    elif favours[keep] and favours[learn]:
        verdict = "**The mask prevents collapse and helps there**"
    elif favours[keep] and learn.word == "null":
        verdict = "**The mask keeps the entropy up without a measured gain**"
    else:
        verdict = "**The mask is not shown to change the collapse on this test bed**"
    return [f"- {verdict}: entropy kept, {contrast_text(keep)}; {PRIMARY}, {contrast_text(learn)}.",
            "- No preset value changes, whatever the calls: `docs/algorithm.md` quotes this line."]


def collapsed_seeds(results: Path, study: Study) -> str:
    """How many finished seeds of each arm meet the calibration's criterion (described, not tested)."""
    steps = int(study.regime["STEPS"])
    parts = []
    for arm in study.arms:
        folders = [results / Run(arm, seed).name for seed in study.seeds[arm.group]]
        done = [folder for folder in folders if finished(folder, steps)]
        met = sum(collapse_check(folder, steps).met for folder in done)
        parts.append(f"`{arm.name}` {met} of {len(done)}")
    return ("**The calibration's criterion on each finished seed** (entropy at the last step at most "
            f"{COLLAPSE_SHARE:g} of the first step's, after learning): " + ", ".join(parts) + ".")


def contrasts_section(compared: dict[str, tuple[Comparison, Path]], study: Study, results: Path) -> list[str]:
    """The page's account of a study with contrasts: what it describes (the clip band's manipulation check, the
    collapse comparison's criterion per seed), the table of the plan's contrasts, and its decisions."""
    (_, out), = compared.values()
    values = {contrast.metric: per_seed(out, contrast.metric) for contrast in study.contrasts}
    calls = contrast_calls(values, study)
    if study.name == CLIPBAND.name:
        arms = [arm.name for arm in study.arms]
        fractions = clip_fractions(out, arms)
        head = ("**The manipulation check** (seed-mean clip fraction, `actor/pg_clipfrac` over the steps; the wide "
                f"band unbinds an arm below {UNBOUND_CLIP_FRACTION}): "
                + ", ".join(f"`{arm}` {fractions[arm]:.4f} over {len(values[PRIMARY][arm])} seeds" for arm in arms
                            if arm in fractions) + ".")
        decisions = clip_band_decisions(calls, values[PRIMARY], fractions)
    else:
        head, decisions = collapsed_seeds(results, study), mask_collapse_decisions(calls)
    lines = [head, "",
             "**The plan's contrasts** (reference minus arm, paired by seed; p unadjusted, the call by Holm's rule "
             f"over the {len(calls)} contrasts at {CONTRAST_ALPHA} and an interval that excludes 0; pending until "
             "every contrast has its planned pairs):", "",
             "| question | metric | reference | arm | pairs | mean difference | 95% interval | p | Holm | call | "
             "ahead |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for call in calls:
        interval = "nan" if math.isnan(call.low) else f"[{call.low:+.4f}, {call.high:+.4f}]"
        lines.append(f"| {call.contrast.question} | {call.contrast.metric} | {call.contrast.reference} | "
                     f"{call.contrast.arm} | {len(call.differences)} of {call.planned} | {call.mean:+.4f} | "
                     f"{interval} | {call.p:.3g} | {'rejects' if call.holm else '-'} | {call.word} | {call.ahead} |")
    return [*lines, "", "**The plan's decisions**:", "", *decisions, ""]


def page_section(compared: dict[str, tuple[Comparison, Path]], page: Path, study: Study, results: Path) -> str:
    """The generated part of the results page for `study`: the chain test bed's check (from `results`), then each
    comparison's compare.md and links to its plots."""
    lines = [study.page_begin, ""]
    check = rise_check(results, study) if study is CHAIN else None
    if check:
        lines += [check, ""]
    if study is CHAIN and compared:
        lines += calls_section(plan_calls(compared, study))
    if study.contrasts and compared:
        lines += contrasts_section(compared, study, results)
    if study is COLLAPSE:
        lines += collapse_section(results, int(study.regime["STEPS"]))
    for name, (comparison, out) in compared.items():
        lines += [f"#### {comparison.title}", ""]
        lines += [(out / "compare.md").read_text(encoding="utf-8").rstrip(), ""]
        for png in sorted(out.glob("*.png")):
            lines += [f"![{name}: {png.stem.replace('_', ' ')}]({os.path.relpath(png, page.parent)})", ""]
    return "\n".join([*lines, study.page_end])


def uncalibrated_section(results: Path, steps: int) -> str:
    """The collapse comparison's part of the page while the calibration (in `results`) has met no level: waiting
    for it, or, once it is over, not run, as its plan says."""
    next_run, _, state = collapse_state(results, steps)
    if next_run is not None:
        words = f"No run yet: the comparison waits for the calibration above ({state})."
    else:
        words = (f"**Not run**: the calibration above is over and met no level ({state}). As this plan says, the "
                 "comparison runs only in a regime the calibration found, so no run with the mask was made: on this "
                 "test bed, within these levers, the failure the mask targets did not occur, and the mask was not "
                 "tested against it.")
    return "\n".join([MASK_COLLAPSE.page_begin, words, MASK_COLLAPSE.page_end])


def write_page(results_root: Path, studies: list[Study], page: Path, log, plots: bool = True) -> None:
    """Regenerate each study's comparisons and splice them into `page` between its markers (a study with no
    finished run keeps what the page has there)."""
    text = page.read_text(encoding="utf-8")
    for study in (resolved(study, results_root) for study in studies):
        if study.page_begin not in text or study.page_end not in text:
            raise StudyError(f"{page} has no markers for study {study.name}: add the lines {study.page_begin!r} "
                             f"and {study.page_end!r}")
        if study is MASK_COLLAPSE:  # not resolved: the calibration has met no level (yet)
            section = uncalibrated_section(results_root / study.results_name, int(study.regime["STEPS"]))
        else:
            compared = compare(results_root / study.results_name, study, log, plots)
            if not compared:
                log(f"[study] {study.name}: no finished runs yet; its part of {page} is left as it is")
                continue
            section = page_section(compared, page, study, results_root / study.results_name)
        head, _, rest = text.partition(study.page_begin)
        _, _, tail = rest.partition(study.page_end)
        text = head + section + tail
    page.write_text(text, encoding="utf-8")
    log(f"[study] wrote the study tables into {page}")


# --------------------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/study.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default=DEFAULT_STUDY, choices=list(STUDIES),
                        help=f"the study (default {DEFAULT_STUDY})")
    parser.add_argument("--arms", default="all", help="all (default), a group (main, dose, control) or "
                                                      "comma-separated arm names")
    parser.add_argument("--seeds", default=None,
                        help="e.g. 1-5 or 1,3 for every chosen arm (default: the study's seeds of each arm's group)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: the regime's)")
    parser.add_argument("--results-root", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--scratch-root", type=Path, default=REPO / "runs" / "study")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the recipe (default recipes/cpu.sh)")
    parser.add_argument("--lock", default=None,
                        help="hold an flock on this file during each run (a machine shared by others who use it)")
    parser.add_argument("--timeout", type=float, default=5400,
                        help="seconds allowed per run (default 5400: a run takes about 17 minutes on a quiet 2-core "
                        "machine, up to three times that beside other work)")
    parser.add_argument("--max-runs", type=int, default=None, help="stop after this many new runs")
    parser.add_argument("--list", action="store_true", help="print the plan and which runs are finished; run nothing")
    parser.add_argument("--no-compare", action="store_true", help="skip the comparisons and the page at the end")
    parser.add_argument("--page", action="store_true",
                        help="only regenerate every study's comparisons and its part of the results page")
    parser.add_argument("--page-file", type=Path, default=REPO / "docs" / "results.md",
                        help="the results page (default docs/results.md)")
    parser.add_argument("--no-plots", action="store_true", help="comparisons without PNG plots")
    return parser


def main(argv: list[str] | None = None, log=print) -> int:
    args = build_parser().parse_args(argv)
    study = STUDIES[args.study]
    python = os.environ.get("PYTHON") or sys.executable
    try:
        study = resolved(study, args.results_root.resolve())
        if args.page:
            write_page(args.results_root.resolve(), list(STUDIES.values()), args.page_file, log,
                       plots=not args.no_plots)
            return 0
        steps = int(study.regime["STEPS"]) if args.steps is None else args.steps
        if steps < 1:
            raise StudyError(f"--steps must be >= 1, got {steps}")
        regime = {**study.regime, "STEPS": str(steps)}
        results = (args.results_root / study.results_name).resolve()
        scratch = (args.scratch_root / study.results_name).resolve()
        if study is MASK_COLLAPSE:  # not resolved: the calibration has met no level
            state = collapse_state(results, steps)[2]
            if not args.list:
                raise StudyError(f"study {study.name} runs in the regime the collapse calibration finds, and it has "
                                 f"found none: {state} (python benchmarks/study.py --study {COLLAPSE.name})")
            log(f"study {study.name}: no arms yet; they take the level the collapse calibration meets ({state})")
            return 0
        coef = control_coef(results, steps) if study is CHAIN else None
        groups = [*study.seeds]
        arms = select_arms(args.arms, study_arms(study, coef) if coef is not None or study is not CHAIN
                           else (*study.arms, *CONTROL_TEMPLATES), groups)
        waiting = [arm for arm in arms if arm.group == "control" and coef is None]
        arms = [arm for arm in arms if arm not in waiting]
        check_presets(arms)
        if study is COLLAPSE and (args.arms != "all" or args.seeds):
            raise StudyError(f"study {study.name} chooses its runs by its procedure (docs/results.md); drop --arms "
                             f"{args.arms} and --seeds {args.seeds}")
        runs = plan(arms, parse_seeds(args.seeds) if args.seeds else None, study)
        if args.list:
            log(f"study {study.name}: regime {regime}; verl overrides for every run: "
                f"{' '.join(study.common_overrides)}; target {study.target}"
                + (f"; superseded: {study.superseded}" if study.superseded else ""))
            if study is CHAIN:
                log(f"  the test bed's check ({RISE_ARM} seeds {CHECK_SEEDS[0]}-{CHECK_SEEDS[-1]} first, no other run "
                    f"before it): {gate_state(results, steps)}")
            if study is COLLAPSE:
                log(f"  the calibration (levels in order, {COLLAPSE_ARMS[0]} first at each): "
                    f"{collapse_state(results, steps)[2]}")
            for arm in [*arms, *waiting]:
                seeds = [r.seed for r in runs if r.arm is arm] or list(study.seeds[arm.group])
                done = [s for s in seeds if finished(results / f"{arm.name}-seed{s}", steps)]
                pending = " (kl_coef pending: the dose arms' seeds 1-5 first)" if arm in waiting else ""
                log(f"  {arm.name:20} {arm.group:8} preset {arm.preset:12} seeds {seeds} finished {done}  "
                    f"{' '.join(arm.overrides)}{pending}")
            return 0
        if study.superseded:
            raise StudyError(f"study {study.name} is superseded ({study.superseded}); use --page for its tables")
        check_study(results, regime, study)
        todo = [run for run in runs if not finished(results / run.name, steps)]
        passed = test_bed_passed(results, steps) if study is CHAIN else True
        if passed is False:
            _, at_from, at_last = grpo_rise(results, steps, CHECK_SEEDS)
            raise StudyError(f"the test bed failed its check: {RISE_ARM}'s seeds {CHECK_SEEDS[0]}-{CHECK_SEEDS[-1]} "
                             f"rose {at_last - at_from:+.3f} from step {RISE_FROM} to step {steps}, under "
                             f"+{RISE_MIN:.2f}; no other run starts (docs/results.md, the plan)")
    except (StudyError, RunError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        failed = (calibrate(results, scratch, regime, steps, args, python, log) if study is COLLAPSE
                  else run_plan(todo, passed, runs, results, scratch, regime, args, python, log, study, waiting))
        if failed:
            log(f"[study] {len(failed)} failed runs (rerun the same command to retry them): {', '.join(failed)}")
        if not args.no_compare:
            write_page(args.results_root.resolve(), [study], args.page_file, log, plots=not args.no_plots)
    except (StudyError, RunError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 1 if failed else 0


def calibrate(results: Path, scratch: Path, regime: dict, steps: int, args, python: str, log) -> list[str]:
    """The collapse calibration's runs, one at a time, each chosen by its procedure (collapse_state) from the runs
    finished before it; stops at a failed run (returned), at --max-runs new runs, or when the calibration is over."""
    started = 0
    while True:
        run, _, state = collapse_state(results, steps)
        log(f"[study] {COLLAPSE.name}: {state}")
        if run is None or (args.max_runs is not None and started >= args.max_runs):
            return []
        if not run_one(run, results, scratch, regime, args.recipe.resolve(), args.lock, python, args.timeout, log,
                       COLLAPSE):
            return [run.name]
        started += 1


def run_plan(todo: list[Run], passed, runs: list[Run], results: Path, scratch: Path, regime: dict, args,
             python: str, log, study: Study, waiting: list[Arm]) -> list[str]:
    """Every unfinished run of the plan in its order (the chain study's gate first); returns the failed ones."""
    held = [run for run in todo if not passed and not gate_run(run, study)]
    todo = [run for run in todo if run not in held]
    log(f"[study] {study.name}: {len(runs)} runs planned, {len(runs) - len(todo) - len(held)} finished (skipped), "
        f"{len(todo)} to run; results in {results}")
    if held:
        log(f"[study] {len(held)} runs wait for the test bed's check ({RISE_ARM} seeds {CHECK_SEEDS[0]}-"
            f"{CHECK_SEEDS[-1]} first); rerun this command once they are finished")
    if waiting:
        log(f"[study] the control arms ({', '.join(a.name for a in waiting)}) wait for their kl_coef: the dose "
            f"arms' seeds {DOSE_SEEDS[0]}-{DOSE_SEEDS[-1]} first")
    if args.max_runs is not None:
        todo = todo[: args.max_runs]
    return [run.name for run in todo
            if not run_one(run, results, scratch, regime, args.recipe.resolve(), args.lock, python, args.timeout,
                           log, study)]


if __name__ == "__main__":
    sys.exit(main())
