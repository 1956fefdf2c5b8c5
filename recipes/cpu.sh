#!/usr/bin/env bash
# Run verl 0.9.1's real trainer (python -m verl.trainer.main_ppo: FSDP2 actor, vLLM rollout, Ray) with a
# tepo-verl algorithm preset on a CPU-only machine, on the tiny addition task (lab/tepo_lab/tiny).
#
#   ALGO=tepo STEPS=3 bash recipes/cpu.sh [extra verl overrides...]
#
# Needs the CPU stack in the active venv (bash lab/tepo_lab/cpu/install_cpu.sh). Env:
#   ALGO      tepo (default) | grpo | dapo | tepo_nomask  (any preset in tepo_verl/config/algorithm/)
#   STEPS     training steps (default 3)
#   SEED      seed of the data order, the rollout sampler and the actor (default 1)
#   RUNS_ROOT folder holding every CPU run, compared at the end (default runs/cpu)
#   RUN_DIR   this run's folder (default $RUNS_ROOT/$ALGO-seed$SEED); the file logger writes
#             $RUN_DIR/metrics.jsonl (VERL_FILE_LOGGER_PATH), the console goes to stdout (and $RUN_DIR/console.log)
#   TEST_FREQ validate every N steps (default 5; also before training and at the last step)
#   MINI      prompts per PPO mini-batch (default BATCH/2: two updates per step, the second one off-policy,
#             so the ratio, clipping and KL mask see current != old as on a GPU cluster)
#   TASK      addition (default: 'What is 37+45?', 3-token responses) | scratchpad (4 operands, partial sums
#             before the answer, 26-29-token responses; lab/tepo_lab/tiny/scratchpad.py) | chain (the scratchpad
#             with 3 to 5 operands, each partial sum beside its operands: 21-59-token responses, validated on
#             256 problems)
#   TINY_DIR  a tiny build to use (default: built or reused from ~/.cache/tepo-verl/tiny with the policy shipped in
#             the package, the same start on every machine)
#   N         rollouts per prompt (default 4), BATCH prompts per step (default 4)
#   LR        the actor's learning rate (default 1e-4)
#   PRECISION float32 (default: the FSDP actor and reference compute in float32, so the loss gets float32
#             log-probs, as verl's GPU paths give it) | bf16 (verl's CPU default: bf16 log-probs, whose ratio near 1
#             moves in steps of 3.9e-3, coarser than GSPO/TEPO's 3e-4 clip; tepo_verl/verl_adapter/precision.py)
#   PYTHON    interpreter (default: python)
#   DRY_RUN=1 print the composed config (`--cfg job`) and start nothing: no training, no tiny build, no version
#             check, so it works on any machine with verl, the plugin and the lab installed
#   DRY_RUN=args  the same, but print the arguments verl would get, one a line, instead of composing them (verl is
#             not imported)
#   QUIET=1   verl's output goes to $RUN_DIR/console.log only, not to stdout (`tepo-lab demo` uses it); when verl
#             fails, the last 25 lines of that log and its path go to stderr, and the recipe exits with verl's status
#   COMPARE=0 skip the comparison table at the end
# Extra arguments are passed to verl after the recipe's own, so they override them.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PY="${PYTHON:-python}"
ALGO="${ALGO:-tepo}"
STEPS="${STEPS:-3}"
N="${N:-4}"
BATCH="${BATCH:-4}"
MINI="${MINI:-$(( BATCH > 1 ? BATCH / 2 : 1 ))}"
SEED="${SEED:-1}"
TEST_FREQ="${TEST_FREQ:-5}"
LR="${LR:-1e-4}"

PRESET_DIR="$REPO/tepo_verl/config/algorithm"
VALID=$(cd "$PRESET_DIR" && ls -1 *.yaml | sed 's/\.yaml$//' | sort | paste -sd' ' -)
if [[ ! -f "$PRESET_DIR/$ALGO.yaml" || ! "$ALGO" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
  echo "recipes/cpu.sh: unknown ALGO='$ALGO'. Valid: ${VALID// /, }" >&2
  exit 2
fi
if ! [[ "$STEPS" =~ ^[1-9][0-9]*$ ]]; then
  echo "recipes/cpu.sh: STEPS must be a positive integer, got '$STEPS'" >&2
  exit 2
fi

if ! [[ "$MINI" =~ ^[1-9][0-9]*$ && "$BATCH" =~ ^[1-9][0-9]*$ && "$N" =~ ^[1-9][0-9]*$ ]] || (( BATCH % MINI )); then
  echo "recipes/cpu.sh: BATCH, MINI and N must be positive integers with MINI dividing BATCH, got BATCH='$BATCH' MINI='$MINI' N='$N'" >&2
  exit 2
fi
if ! [[ "$LR" =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] || [[ "$LR" =~ ^[0.]+([eE].*)?$ ]]; then
  echo "recipes/cpu.sh: LR must be a positive number (such as 1e-4 or 0.00003), got '$LR'" >&2
  exit 2
fi
DRY_RUN="${DRY_RUN:-0}"
if [[ "$DRY_RUN" != 0 && "$DRY_RUN" != 1 && "$DRY_RUN" != args ]]; then
  echo "recipes/cpu.sh: DRY_RUN must be 0, 1 or args, got '$DRY_RUN'" >&2
  exit 2
fi
TASK="${TASK:-addition}"
case "$TASK" in
  addition) MAX_RESPONSE=8 ;;
  scratchpad) MAX_RESPONSE=48 ;;
  chain) MAX_RESPONSE=64 ;;
  *) echo "recipes/cpu.sh: unknown TASK='$TASK'. Valid: addition, scratchpad, chain" >&2; exit 2 ;;
esac

PRECISION="${PRECISION:-float32}"
case "$PRECISION" in
  float32) mapfile -t PRECISION_OVERRIDES < <("$PY" -c \
             'from tepo_verl.verl_adapter.precision import FLOAT32_OVERRIDES; print("\n".join(FLOAT32_OVERRIDES))') ;;
  bf16) PRECISION_OVERRIDES=() ;;
  *) echo "recipes/cpu.sh: unknown PRECISION='$PRECISION'. Valid: float32, bf16" >&2; exit 2 ;;
esac

if [[ -n "${RUN_DIR:-}" ]]; then
  RUNS_ROOT="${RUNS_ROOT:-$(dirname "$RUN_DIR")}"
else
  RUNS_ROOT="${RUNS_ROOT:-$REPO/runs/cpu}"
  RUN_DIR="$RUNS_ROOT/$ALGO-seed$SEED"
fi
if [[ "$DRY_RUN" == 0 ]]; then
  mkdir -p "$RUN_DIR"
  RUN_DIR="$(cd "$RUN_DIR" && pwd)"
  RUNS_ROOT="$(cd "$RUNS_ROOT" && pwd)"
fi

# The lab's CPU mode (lab/tepo_lab/cpu, hooked into every verl process by the lab's entry point), and the environment
# it needs.
export TEPO_VERL_CPU=1
export TEPO_VERL_COMPARE_METRICS=1        # the columns `tepo-verl compare` reads beyond verl's own (docs/compare.md)
export VERL_PLATFORM=cpu
export VERL_ENGINE_DEVICE=cuda            # verl's FSDP engine is registered for cuda/npu; tensors stay on cpu
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"   # GiB of KV cache
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"
export RAY_DEDUP_LOGS=0
export TOKENIZERS_PARALLELISM=false
export HYDRA_FULL_ERROR=1
export VERL_FILE_LOGGER_PATH="${VERL_FILE_LOGGER_PATH:-$RUN_DIR/metrics.jsonl}"
# transfer_queue asks torch for 8 threads and warns (hundreds of lines from every Ray worker) on smaller machines.
export TQ_NUM_THREADS="${TQ_NUM_THREADS:-$("$PY" -c 'import psutil; print(min(8, psutil.cpu_count(logical=False) or 1))')}"

# The variables above reach every Ray process through verl's runtime env (ray_kwargs.ray_init.runtime_env): on a Ray
# cluster started beforehand (`ray start`, then RAY_ADDRESS=...), what this shell exports reaches the driver alone.
# Such a cluster has its resources already, so ray.init must not be given num_cpus/num_gpus there.
hydra_quoted() { local value=${1//\'/\\\'}; printf "'%s'" "$value"; }
RAY_ARGS=()
for name in TEPO_VERL_CPU TEPO_VERL_COMPARE_METRICS VERL_PLATFORM VERL_ENGINE_DEVICE VLLM_CPU_KVCACHE_SPACE VLLM_CPU_OMP_THREADS_BIND \
            TOKENIZERS_PARALLELISM VERL_FILE_LOGGER_PATH TQ_NUM_THREADS; do
  [[ -n "${!name-}" ]] && RAY_ARGS+=("+ray_kwargs.ray_init.runtime_env.env_vars.$name=$(hydra_quoted "${!name}")")
done
[[ -n "${RAY_ADDRESS:-}" ]] || RAY_ARGS+=(ray_kwargs.ray_init.num_cpus=16 +ray_kwargs.ray_init.num_gpus=1)

# The tiny task, its reward and the CPU mode are the lab's (lab/, installed beside the plugin by `make install`).
if ! "$PY" -c 'import tepo_lab' 2>/dev/null; then
  echo "recipes/cpu.sh: the CPU lab (package tepo_lab) is not installed for $PY: make install, or pip install -e lab" >&2
  exit 1
fi
if [[ "$DRY_RUN" != 0 ]]; then
  TINY_DIR="${TINY_DIR:-$("$PY" -m tepo_lab.tiny build --task "$TASK" --print dir --dry-run)}"
  unset TEPO_VERL_CPU VERL_PLATFORM VERL_ENGINE_DEVICE   # composing the config needs no CPU mode
else
  "$PY" -m tepo_lab.cpu.versions --no-import >/dev/null || { "$PY" -m tepo_lab.cpu.versions --no-import; exit 1; }
  if [[ -z "${TINY_DIR:-}" ]]; then
    TINY_DIR="$("$PY" -m tepo_lab.tiny build --task "$TASK" --print dir)"
  else
    "$PY" -m tepo_lab.tiny build --task "$TASK" --out "$TINY_DIR" --print dir >/dev/null
  fi
fi
MODEL="$TINY_DIR/model"
REWARD="$("$PY" -c 'import tepo_lab.tiny.reward as r; print(r.__file__)')"

# verl's command; DRY_RUN=args prints its arguments instead, one a line
VERL=("$PY" -m verl.trainer.main_ppo)
[[ "$DRY_RUN" == args ]] && VERL=(printf '%s\n')
run_verl() {
"${VERL[@]}" \
  "algorithm=$ALGO" \
  data.train_files="$TINY_DIR/data/train.parquet" \
  data.val_files="$TINY_DIR/data/val.parquet" \
  data.train_batch_size="$BATCH" \
  data.seed="$SEED" \
  data.max_prompt_length=64 \
  data.max_response_length="$MAX_RESPONSE" \
  data.filter_overlong_prompts=False \
  data.dataloader_num_workers=0 \
  actor_rollout_ref.model.path="$MODEL" \
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
  actor_rollout_ref.model.use_remove_padding=False \
  actor_rollout_ref.actor.strategy=fsdp2 \
  actor_rollout_ref.ref.strategy=fsdp2 \
  actor_rollout_ref.actor.optim.lr="$LR" \
  actor_rollout_ref.actor.ppo_mini_batch_size="$MINI" \
  actor_rollout_ref.actor.data_loader_seed="$SEED" \
  actor_rollout_ref.rollout.seed="$SEED" \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$((MINI * N)) \
  actor_rollout_ref.actor.use_dynamic_bsz=False \
  actor_rollout_ref.actor.fsdp_config.param_offload=False \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$((BATCH * N)) \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n="$N" \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.dtype=float32 \
  actor_rollout_ref.rollout.enforce_eager=True \
  actor_rollout_ref.rollout.free_cache_engine=False \
  +actor_rollout_ref.rollout.enable_sleep_mode=False \
  actor_rollout_ref.rollout.max_num_seqs=16 \
  actor_rollout_ref.rollout.max_num_batched_tokens=512 \
  actor_rollout_ref.rollout.max_model_len=128 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$((BATCH * N)) \
  actor_rollout_ref.rollout.agent.num_workers=1 \
  actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=16 \
  reward.custom_reward_function.path="$REWARD" \
  reward.custom_reward_function.name=compute_score \
  reward.num_workers=1 \
  trainer.device=cpu \
  trainer.nnodes=1 \
  trainer.n_gpus_per_node=1 \
  trainer.total_training_steps="$STEPS" \
  trainer.total_epochs=1 \
  trainer.val_before_train=True \
  trainer.test_freq="$TEST_FREQ" \
  trainer.save_freq=-1 \
  trainer.project_name=tepo_verl_cpu \
  trainer.experiment_name="$(basename "$RUN_DIR")" \
  trainer.default_local_dir="$RUN_DIR/checkpoints" \
  trainer.validation_data_dir="$RUN_DIR/val_generations" \
  'trainer.logger=["console","file"]' \
  "${RAY_ARGS[@]}" \
  transfer_queue.backend.SimpleStorage.num_data_storage_units=1 \
  ${PRECISION_OVERRIDES[@]+"${PRECISION_OVERRIDES[@]}"} \
  "$@"
}

if [[ "$DRY_RUN" == 1 ]]; then
  run_verl "$@" --cfg job     # the composed config on stdout, verl's warnings on stderr
  exit $?
elif [[ "$DRY_RUN" == args ]]; then
  run_verl "$@"
  exit $?
fi

echo "[cpu.sh] ALGO=$ALGO TASK=$TASK PRECISION=$PRECISION STEPS=$STEPS RUN_DIR=$RUN_DIR TINY_DIR=$TINY_DIR${RAY_ADDRESS:+ RAY_ADDRESS=$RAY_ADDRESS}"
echo "[cpu.sh] file logger: $VERL_FILE_LOGGER_PATH"
# verl's file logger truncates its file: a run that resumes from a checkpoint keeps the metrics so far as a segment
"$PY" -m tepo_verl.report.runs keep-segments "$VERL_FILE_LOGGER_PATH" "$RUN_DIR/checkpoints" "$@"
cd "$RUN_DIR"
set -o pipefail
if [[ "${QUIET:-0}" == 1 ]]; then
  # verl's output goes to the log alone; a failure shows the log's end and its path, and exits with verl's status
  status=0
  run_verl "$@" > "$RUN_DIR/console.log" 2>&1 || status=$?
  if (( status != 0 )); then
    {
      echo "[cpu.sh] verl failed (exit $status); the end of its log:"
      tail -n 25 "$RUN_DIR/console.log" | sed 's/^/    /'
      echo "[cpu.sh] the whole log: $RUN_DIR/console.log"
    } >&2
    exit "$status"
  fi
else
  run_verl "$@" 2>&1 | tee "$RUN_DIR/console.log"
fi

[[ "${COMPARE:-1}" == 0 ]] && exit 0
# The comparison table over every run under RUNS_ROOT (run other ALGO/SEED values to fill it in).
echo "[cpu.sh] comparison of the runs under $RUNS_ROOT:"
"$PY" -m tepo_verl.report.compare "$RUNS_ROOT" --out "$RUNS_ROOT/compare"
