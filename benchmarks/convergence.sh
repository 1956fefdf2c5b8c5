#!/usr/bin/env bash
# Convergence on the tiny CPU task: recipes/cpu.sh for each algorithm and seed, then the comparison report
# (steps-to-target of TEPO relative to GRPO and DAPO, entropy at start and end).
#
#   ALGOS="tepo grpo dapo" SEEDS="1 2" STEPS=20 bash benchmarks/convergence.sh [--target 0.5]
#
# Needs the CPU stack (bash lab/tepo_lab/cpu/install_cpu.sh). Each run takes about 2 minutes of start-up plus
# a few seconds per step on 2 cores. Arguments are passed to `tepo-verl compare`.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ALGOS="${ALGOS:-tepo grpo dapo}"
SEEDS="${SEEDS:-1 2}"
STEPS="${STEPS:-20}"
TEST_FREQ="${TEST_FREQ:-2}"
RUNS_ROOT="${RUNS_ROOT:-$HERE/../runs/convergence}"
mkdir -p "$RUNS_ROOT"
for seed in $SEEDS; do
  for algo in $ALGOS; do
    echo "[convergence] ALGO=$algo SEED=$seed STEPS=$STEPS"
    start=$(date +%s)
    ALGO="$algo" SEED="$seed" STEPS="$STEPS" TEST_FREQ="$TEST_FREQ" RUNS_ROOT="$RUNS_ROOT" \
      bash "$HERE/../recipes/cpu.sh" > "$RUNS_ROOT/$algo-seed$seed.log" 2>&1 \
      || { echo "[convergence] $algo seed $seed failed: see $RUNS_ROOT/$algo-seed$seed.log" >&2; exit 1; }
    echo "[convergence] done in $(( $(date +%s) - start )) s"
  done
done
python -m tepo_verl.report.compare "$RUNS_ROOT" --out "$RUNS_ROOT/compare" "$@"
