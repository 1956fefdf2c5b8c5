"""How often the `surprisal` and `surprisal_old` mask rules disagree, in the paper's regime of 8 updates per step.

    python benchmarks/mask_disagreement.py [--steps 6] [--out runs/mask_disagreement]

Runs verl's real trainer on CPU (recipes/cpu.sh, the tiny task) with the `tepo` preset, group size 8, 8 prompts
per step and 8 PPO mini-batches of one prompt each (one epoch), with `mask_rule=surprisal` and
`calculate_entropy=True`, so the loss sees both the current and the stored old entropies and logs
`tepo/surprisal_disagreement`: the fraction of valid tokens whose mask decision differs between
l + H > 0 (current policy) and l_old + H_old > 0 (stored). Each update is one micro-batch, so verl's step value is
the mean over the 8 updates; the first update of a step is on-policy and disagrees on exactly 0 tokens, so the
mean over the 7 later updates is 8/7 of the step value.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UPDATES = 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--task", choices=("addition", "scratchpad"), default="addition",
                        help="the tiny task (recipes/cpu.sh TASK): 3-token answers, or ~48-token scratchpads")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "mask_disagreement")
    args = parser.parse_args(argv)
    run_dir = args.out / f"tepo-surprisal-{args.task}-seed{args.seed}"
    env = dict(os.environ, ALGO="tepo", STEPS=str(args.steps), RUN_DIR=str(run_dir), PYTHON=sys.executable,
               BATCH=str(UPDATES), N="8", MINI="1", SEED=str(args.seed), TEST_FREQ=str(args.steps), COMPARE="0",
               TASK=args.task)
    env.pop("VERL_FILE_LOGGER_PATH", None)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "bench-console.log", "w") as console:
        proc = subprocess.run(
            ["bash", str(REPO / "recipes" / "cpu.sh"), "actor_rollout_ref.actor.calculate_entropy=True",
             "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=surprisal"],
            env=env, cwd=REPO, stdout=console, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"mask_disagreement: the run failed (rc={proc.returncode}); see {run_dir}/bench-console.log")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = []
    for record in records:
        data = record["data"]
        if "actor/tepo/surprisal_disagreement" in data:
            step_mean = float(data["actor/tepo/surprisal_disagreement"])
            mask = float(data["actor/tepo/mask_frac"])
            rows.append((record["step"], step_mean * UPDATES / (UPDATES - 1), mask))
    if not rows:
        raise SystemExit("mask_disagreement: no step logged tepo/surprisal_disagreement")
    print(f"step  disagreement on updates 2..{UPDATES} (fraction of valid tokens)  mask fraction (all updates)")
    for step, later, mask in rows:
        print(f"{step:>4}  {later:>10.4%}  {mask:>10.4%}")
    later = [r[1] for r in rows]
    masks = [r[2] for r in rows]
    print(f"mean over {len(rows)} steps: disagreement {statistics.mean(later):.4%} of valid tokens on the later "
          f"updates, i.e. {statistics.mean(later) / statistics.mean(masks):.2%} of the mask's size "
          f"(mask fraction {statistics.mean(masks):.2%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
