#!/usr/bin/env bash
# Shared body of the GPU recipes: FSDP2 (or Megatron) actor + vLLM rollout on verl's stock entry point (verl 0.9.1
# keys). Install tepo-verl with the extras they use, in the environment that runs verl:
#   pip install -e '.[reward,report]'     (the maths reward, data conversion and evaluation; tepo-verl compare)
# A model recipe sets MODEL_* defaults and calls `run_recipe "$@"`. ALGO selects the preset and is the ONLY
# thing that differs between algorithms, so a comparison is fair by construction. Every number is reasoned in
# docs/recipes.md (memory, rollout TP, token budgets, validation cost, checkpoint disk use).
#
# Environment (defaults in brackets; [recipe] = set by the model recipe):
#   ALGO            a preset of tepo_verl/config/algorithm/ (tepo, tepo_nomask, gspo, grpo, dapo, ...)  [tepo]
#   ENGINE          fsdp | megatron: the actor's (and reference's) training engine            [fsdp]
#   MEGATRON_TP, MEGATRON_PP, MEGATRON_CP  Megatron tensor / pipeline / context parallel sizes  [recipe, else 1]
#   MODEL_PATH      HF hub id or local folder                                             [recipe]
#   MODEL_CONTEXT   the model's context in tokens, for the length guard                   [a local folder's config.json
#                   max_position_embeddings, else the recipe's model]
#   DATA_DIR        folder of `python -m tepo_verl.data convert dapo_math_17k eval --out-dir DIR`  [$HOME/data/tepo-verl]
#   TRAIN_FILES     training parquet(s), comma-separated                                   [$DATA_DIR/dapo_math_17k.parquet]
#   VAL_FILES       validation parquets (the benchmark suite), comma-separated             [six eval sets in $DATA_DIR]
#   NNODES, GPUS_PER_NODE                                                                  [recipe, 8]
#   TRAIN_BATCH_SIZE  prompts per step                                                     [recipe]
#   MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH  tokens (data.max_* on the command line work too) [recipe]
#   ROLLOUT_TP      vLLM tensor-parallel size                                              [recipe]
#   GPU_MEMORY_UTILIZATION  vLLM's share of each GPU                                       [recipe]
#   OFFLOAD         1 = actor parameters + optimizer to CPU between phases                 [recipe]
#   SP              Ulysses sequence-parallel size of the FSDP actor (and the reference)   [1]
#   OUTPUT_DIR      checkpoints, validation generations, file-logger JSONL (on a shared filesystem for several
#                   nodes: docs/recipes.md)                                                [$PWD/runs]
#   RAY_ADDRESS     a Ray cluster started beforehand (`ray start`; every multi-node job)   [none: a local Ray]
#   EXPERIMENT      experiment name                                                        [<algo>-<model tag>-seed<SEED>]
#   PROJECT         project name                                                           [tepo-verl]
#   LOGGER          verl loggers, e.g. console,file,wandb                                  [console,file; val-only: console]
#   SEED            data-loader / rollout seed                                             [1]
#   TOTAL_STEPS     training steps                                                         [recipe]
#   TEST_FREQ       validate every N steps (also before training and at the last step)    [recipe]
#   VAL_N           samples per validation problem                                         [1; val-only: 16]
#   VAL_MAX_SAMPLES validate on a random subset of this many problems (-1 = all)           [recipe]
#   SAVE_FREQ       save a checkpoint every N steps (and at the last step)                 [recipe]
#   MAX_CKPT_TO_KEEP  checkpoints kept on disk (older ones are deleted)                    [2]
#   VAL_ONLY=1 CKPT=.../checkpoints/global_step_N
#                   no training: load that checkpoint's model and validate once with VAL_N samples per problem on
#                   the full suite; generations go to <run>/eval_generations/N.jsonl (for `tepo-verl eval`).
#                   Use the cluster shape (NNODES x GPUS_PER_NODE) of the run that saved it: shards are per rank.
#   DRY_RUN=1       compose and print the full config (`--cfg job`) instead of running
#   DRY_RUN=args    print the arguments verl would get, one a line, and start nothing (verl is not imported)
# Extra command-line arguments are passed to verl last, so they override everything here.

set -euo pipefail

PRESET_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../tepo_verl/config/algorithm" && pwd)"
mapfile -t VALID_ALGOS < <(cd "$PRESET_DIR" && ls -1 *.yaml | sed 's/\.yaml$//' | sort)

die() {
  echo "error: $*" >&2
  exit 2
}

check_algo() {
  local algo
  for algo in "${VALID_ALGOS[@]}"; do
    [[ "$1" == "$algo" ]] && return 0
  done
  die "unknown ALGO='$1'; valid: ${VALID_ALGOS[*]}"
}

check_model_path() {
  [[ -n "$1" ]] || die "MODEL_PATH is empty; set it to a Hugging Face id (e.g. Qwen/Qwen2.5-Math-1.5B) or a local folder"
  if [[ "$1" == /* || "$1" == .* || "$1" == ~* ]] && [[ ! -d "$1" ]]; then
    die "MODEL_PATH='$1' is not an existing folder"
  fi
}

# require_int NAME VALUE MIN: VALUE is an integer >= MIN, else a one-line error naming it.
require_int() {
  [[ "$2" =~ ^-?[0-9]+$ ]] && (( $2 >= $3 )) || die "$1 must be an integer >= $3, got '$2'"
}

# VALUE -> 'VALUE', a Hydra quoted string (a number or a path stays a string; quotes in it are escaped)
hydra_quoted() {
  local value=${1//\'/\\\'}
  printf "'%s'" "$value"
}

# "a,b,c" -> '["a","b","c"]' (a Hydra list literal)
hydra_list() {
  local IFS=,
  local items=()
  local item
  for item in $1; do items+=("\"$item\""); done
  local joined
  joined=$(IFS=,; echo "${items[*]}")
  echo "[$joined]"
}

# arg_value KEY ARGS...: the value of the last `KEY=V` (or +KEY=V / ++KEY=V) among ARGS, or nothing; Hydra lets the
# last override win, and so does this.
arg_value() {
  local key=$1
  shift
  local arg value=""
  for arg in "$@"; do
    [[ "$arg" =~ ^\+{0,2}${key//./\\.}=(.*)$ ]] && value=${BASH_REMATCH[1]}
  done
  echo "$value"
}

# The model's context length and where it came from: MODEL_CONTEXT, a local folder's config.json, or the recipe.
model_context() {
  if [[ -n "${MODEL_CONTEXT:-}" ]]; then
    echo "$MODEL_CONTEXT MODEL_CONTEXT"
  elif [[ -f "$MODEL_PATH/config.json" ]]; then
    local ctx
    ctx=$(python -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c.get("max_position_embeddings") or c.get("text_config", {}).get("max_position_embeddings") or "")' "$MODEL_PATH/config.json") \
      || die "cannot read $MODEL_PATH/config.json"
    [[ -n "$ctx" ]] || die "$MODEL_PATH/config.json has no max_position_embeddings; set MODEL_CONTEXT"
    echo "$ctx $MODEL_PATH/config.json"
  else
    echo "$MODEL_DEFAULT_CONTEXT the recipe's $MODEL_DEFAULT_PATH"
  fi
}

run_recipe() {
  local dry_run=${DRY_RUN:-0}
  [[ "$dry_run" == 0 || "$dry_run" == 1 || "$dry_run" == args ]] || die "DRY_RUN must be 0, 1 or args, got '$dry_run'"
  ALGO=${ALGO:-tepo}
  check_algo "$ALGO"
  MODEL_PATH=${MODEL_PATH-$MODEL_DEFAULT_PATH}
  check_model_path "$MODEL_PATH"
  local val_only=${VAL_ONLY:-0}
  [[ "$val_only" == 0 || "$val_only" == 1 ]] || die "VAL_ONLY must be 0 or 1, got '$val_only'"

  # --- lengths, and the guard against a prompt + response longer than the model's context. vLLM would clamp the
  # response budget to what the context leaves, truncating responses without an error; refuse instead.
  local prompt_len=${MAX_PROMPT_LENGTH:-$MODEL_MAX_PROMPT_LENGTH}
  local response_len=${MAX_RESPONSE_LENGTH:-$MODEL_MAX_RESPONSE_LENGTH}
  local cli_value
  cli_value=$(arg_value data.max_prompt_length "$@"); [[ -z "$cli_value" ]] || prompt_len=$cli_value
  cli_value=$(arg_value data.max_response_length "$@"); [[ -z "$cli_value" ]] || response_len=$cli_value
  require_int "max prompt length" "$prompt_len" 1
  require_int "max response length" "$response_len" 1
  local context context_source context_info
  context_info=$(model_context) || exit 2
  read -r context context_source <<<"$context_info"
  require_int "MODEL_CONTEXT" "$context" 1
  local seq_len=$((prompt_len + response_len))
  if (( seq_len > context )); then
    die "prompt + response = $prompt_len + $response_len = $seq_len tokens exceeds the model's context of $context tokens ($context_source); lower MAX_PROMPT_LENGTH / MAX_RESPONSE_LENGTH"
  fi
  local max_model_len=$seq_len
  cli_value=$(arg_value actor_rollout_ref.rollout.max_model_len "$@")
  if [[ -n "$cli_value" ]]; then
    require_int "actor_rollout_ref.rollout.max_model_len" "$cli_value" 1
    (( cli_value >= seq_len && cli_value <= context )) || die "actor_rollout_ref.rollout.max_model_len=$cli_value must lie between prompt + response ($seq_len) and the model's context ($context)"
  fi

  # --- per-GPU token budgets with dynamic batch size: training (forward + backward) MODEL_TRAIN_TOKEN_FACTOR
  # sequences of full length, forward-only log-prob passes (old policy, reference) 1.5x that (docs/recipes.md).
  local train_tokens=$((MODEL_TRAIN_TOKEN_FACTOR * seq_len))
  local logprob_tokens=$((train_tokens * 3 / 2))
  local batched_tokens=$(( seq_len > 8192 ? seq_len : 8192 ))

  local data_dir=${DATA_DIR:-$HOME/data/tepo-verl}
  local eval_sets="aime24 aime25 amc23 math500 minerva olympiadbench"
  local default_val=()
  local name
  for name in $eval_sets; do default_val+=("$data_dir/$name.parquet"); done
  local train_files=${TRAIN_FILES:-$data_dir/dapo_math_17k.parquet}
  local val_files=${VAL_FILES:-$(IFS=,; echo "${default_val[*]}")}
  local seed=${SEED:-1}
  local output_dir=${OUTPUT_DIR:-$PWD/runs}
  local experiment=${EXPERIMENT:-$ALGO-$MODEL_TAG-seed$seed}
  local project=${PROJECT:-tepo-verl}
  local offload=False
  case "${OFFLOAD:-$MODEL_OFFLOAD}" in
    1) offload=True ;;
    0) ;;
    *) die "OFFLOAD must be 0 or 1, got '${OFFLOAD}'" ;;
  esac
  local sp=${SP:-1} tp=${ROLLOUT_TP:-$MODEL_ROLLOUT_TP} keep=${MAX_CKPT_TO_KEEP:-2}
  local test_freq=${TEST_FREQ:-$MODEL_TEST_FREQ} save_freq=${SAVE_FREQ:-$MODEL_SAVE_FREQ}
  local total_steps=${TOTAL_STEPS:-$MODEL_TOTAL_STEPS} val_max=${VAL_MAX_SAMPLES:-$MODEL_VAL_MAX_SAMPLES}
  local nnodes=${NNODES:-$MODEL_NNODES} gpus=${GPUS_PER_NODE:-8}
  local train_batch=${TRAIN_BATCH_SIZE:-$MODEL_TRAIN_BATCH_SIZE}
  require_int SP "$sp" 1
  require_int ROLLOUT_TP "$tp" 1
  require_int MAX_CKPT_TO_KEEP "$keep" 1
  require_int TEST_FREQ "$test_freq" 1
  require_int SAVE_FREQ "$save_freq" 1
  require_int TOTAL_STEPS "$total_steps" 1
  require_int VAL_MAX_SAMPLES "$val_max" -1
  require_int NNODES "$nnodes" 1
  require_int GPUS_PER_NODE "$gpus" 1
  require_int TRAIN_BATCH_SIZE "$train_batch" 1
  (( (nnodes * gpus) % tp == 0 )) || die "ROLLOUT_TP=$tp does not divide the $((nnodes * gpus)) GPUs (NNODES x GPUS_PER_NODE)"

  # --- the training engine of the actor and the reference (docs/recipes.md: FSDP2, or Megatron with TP/PP/CP)
  local engine=${ENGINE:-fsdp}
  local engine_args=()
  case "$engine" in
    fsdp)
      engine_args=(
        "actor_rollout_ref.model.enable_gradient_checkpointing=True"
        "actor_rollout_ref.actor.strategy=fsdp2"
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=$sp"
        # acts only where the update pass computes the entropy with gradient (calculate_entropy=True, e.g. the TEPO
        # mask rules surprisal/old): recompute it in backward instead of keeping a vocabulary-sized tensor
        "actor_rollout_ref.actor.entropy_checkpointing=True"
        "actor_rollout_ref.actor.fsdp_config.param_offload=$offload"
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=$offload"
      )
      ;;
    megatron)
      (( sp == 1 )) || die "SP=$sp is the FSDP engine's Ulysses sequence parallelism; with ENGINE=megatron set MEGATRON_CP"
      local mtp=${MEGATRON_TP:-${MODEL_MEGATRON_TP:-1}} mpp=${MEGATRON_PP:-${MODEL_MEGATRON_PP:-1}}
      local mcp=${MEGATRON_CP:-${MODEL_MEGATRON_CP:-1}}
      require_int MEGATRON_TP "$mtp" 1
      require_int MEGATRON_PP "$mpp" 1
      require_int MEGATRON_CP "$mcp" 1
      (( mtp <= gpus )) || die "MEGATRON_TP=$mtp exceeds GPUS_PER_NODE=$gpus (tensor parallelism stays inside a node)"
      (( (nnodes * gpus) % (mtp * mpp * mcp) == 0 )) || die "MEGATRON_TP x MEGATRON_PP x MEGATRON_CP = $mtp x $mpp x $mcp does not divide the $((nnodes * gpus)) GPUs (NNODES x GPUS_PER_NODE)"
      # verl's Megatron config (model_engine=megatron, what --config-name ppo_megatron_trainer selects); the
      # reference follows the actor's parallel sizes and offload
      engine_args=(
        "model_engine=megatron"
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$mtp"
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$mpp"
        "actor_rollout_ref.actor.megatron.context_parallel_size=$mcp"
        "actor_rollout_ref.actor.megatron.param_offload=$offload"
        "actor_rollout_ref.actor.megatron.optimizer_offload=$offload"
        # full activation recompute, one layer at a time (the FSDP recipes' gradient checkpointing)
        "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full"
        "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform"
        "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1"
      )
      ;;
    *) die "ENGINE must be fsdp or megatron, got '$engine'" ;;
  esac

  # the maths reward, which verl's reward workers load by path: tepo-verl's 'reward' extra (one line when missing)
  local reward_file
  reward_file=$(python - <<'PYEOF'
import sys
try:
    from tepo_verl.extras import MissingExtra
except ImportError as error:
    sys.exit(f"error: cannot import tepo_verl ({error}): pip install -e '.[reward,report]' in this environment")
try:
    import tepo_verl.reward.math_reward as reward
except MissingExtra as error:
    sys.exit(f"error: {error}")
print(reward.__file__)
PYEOF
) || exit 2

  local args=(
    "algorithm=$ALGO"
    # --- data (DAPO-Math-17k training prompts; the six-benchmark validation suite)
    "data.train_files=$(hydra_list "$train_files")"
    "data.val_files=$(hydra_list "$val_files")"
    "data.prompt_key=prompt"
    "data.train_batch_size=$train_batch"
    "data.max_prompt_length=$prompt_len"
    "data.max_response_length=$response_len"
    "data.filter_overlong_prompts=True"
    "data.truncation=error"
    "data.seed=$seed"
    # --- model and actor (the reference model follows the actor's engine)
    "actor_rollout_ref.model.path=$MODEL_PATH"
    "actor_rollout_ref.model.use_remove_padding=True"
    "${engine_args[@]}"
    "actor_rollout_ref.actor.optim.lr=1e-6"
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10"
    "actor_rollout_ref.actor.optim.weight_decay=0.1"
    "actor_rollout_ref.actor.optim.clip_grad=1.0"
    "actor_rollout_ref.actor.ppo_mini_batch_size=$MODEL_MINI_BATCH_SIZE"
    "actor_rollout_ref.actor.ppo_epochs=1"
    "actor_rollout_ref.actor.use_dynamic_bsz=True"
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$train_tokens"
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=$logprob_tokens"
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$logprob_tokens"
    "actor_rollout_ref.actor.data_loader_seed=$seed"
    # --- vLLM rollout: group size 8, temperature 1.0 for training, sampled validation
    "actor_rollout_ref.rollout.name=vllm"
    "actor_rollout_ref.rollout.n=8"
    "actor_rollout_ref.rollout.temperature=1.0"
    "actor_rollout_ref.rollout.top_p=1.0"
    "actor_rollout_ref.rollout.tensor_model_parallel_size=$tp"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${GPU_MEMORY_UTILIZATION:-$MODEL_GPU_MEMORY_UTILIZATION}"
    "actor_rollout_ref.rollout.max_model_len=$max_model_len"
    "actor_rollout_ref.rollout.enable_chunked_prefill=True"
    "actor_rollout_ref.rollout.max_num_batched_tokens=$batched_tokens"
    "actor_rollout_ref.rollout.seed=$seed"
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True"
    "actor_rollout_ref.rollout.val_kwargs.temperature=0.6"
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.95"
    # --- reward: math-verify, thread-safe (tepo_verl.reward)
    "reward.custom_reward_function.path=$reward_file"
    "reward.custom_reward_function.name=compute_score"
    # --- trainer: cluster shape, logging, checkpoints
    "trainer.nnodes=$nnodes"
    "trainer.n_gpus_per_node=$gpus"
    "trainer.project_name=$project"
    "trainer.experiment_name=$experiment"
    "trainer.total_training_steps=$total_steps"
    "trainer.total_epochs=100"
    "trainer.save_freq=$save_freq"
    "trainer.max_actor_ckpt_to_keep=$keep"
    "trainer.default_local_dir=$output_dir/$experiment/checkpoints"
  )

  if [[ "$val_only" == 1 ]]; then
    # --- full evaluation of one checkpoint: its model weights only (no optimizer), the whole suite, VAL_N samples
    local ckpt=${CKPT:-}
    [[ -n "$ckpt" ]] || die "VAL_ONLY=1 needs CKPT=<run>/checkpoints/global_step_N (a checkpoint folder)"
    [[ -d "$ckpt" ]] || die "CKPT='$ckpt' is not an existing folder"
    ckpt=$(cd "$ckpt" && pwd)
    [[ "$(basename "$ckpt")" =~ ^global_step_[0-9]+$ ]] || die "CKPT='$ckpt' must be a checkpoint folder named global_step_N"
    local eval_dir=${EVAL_DIR:-$(dirname "$(dirname "$ckpt")")/eval_generations}
    local val_n=${VAL_N:-16} eval_max=${VAL_MAX_SAMPLES:--1}
    require_int VAL_N "$val_n" 1
    require_int VAL_MAX_SAMPLES "$eval_max" -1
    args+=(
      "actor_rollout_ref.rollout.val_kwargs.n=$val_n"
      "data.val_max_samples=$eval_max"
      "trainer.val_only=True"
      "trainer.val_before_train=True"
      "trainer.resume_mode=resume_path"
      "trainer.resume_from_path=$ckpt"
      "actor_rollout_ref.actor.checkpoint.load_contents=[model]"
      "trainer.logger=$(hydra_list "${LOGGER:-console}")"
      "trainer.validation_data_dir=$eval_dir"
    )
  else
    # --- cheap validation during training (docs/recipes.md: ~15% of the training generations)
    local val_n=${VAL_N:-1}
    require_int VAL_N "$val_n" 1
    local metrics_file=${VERL_FILE_LOGGER_PATH:-$output_dir/$experiment/metrics.jsonl}
    args+=(
      "actor_rollout_ref.rollout.val_kwargs.n=$val_n"
      "data.val_max_samples=$val_max"
      "trainer.val_before_train=True"
      "trainer.test_freq=$test_freq"
      "trainer.logger=$(hydra_list "${LOGGER:-console,file}")"
      "trainer.validation_data_dir=$output_dir/$experiment/val_generations"
      # through verl's runtime env: verl's file logger runs in the trainer, a Ray actor, which on a cluster started
      # beforehand (`ray start`, every multi-node job) does not see what this shell exports
      "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=$(hydra_quoted "$metrics_file")"
      # the columns `tepo-verl compare` reads beyond verl's own (docs/compare.md), logged by verl's trainer process
      "+ray_kwargs.ray_init.runtime_env.env_vars.TEPO_VERL_COMPARE_METRICS='1'"
    )
  fi

  case "$dry_run" in
    1) exec python -m verl.trainer.main_ppo "${args[@]}" "$@" --cfg job ;;
    args) printf '%s\n' "${args[@]}" "$@"; exit 0 ;;
  esac
  mkdir -p "$output_dir/$experiment"
  if [[ "$val_only" == 0 ]]; then
    # verl's file logger truncates its file: a run that resumes from a checkpoint keeps the metrics so far as a
    # segment, which `tepo-verl compare` reads with the rest of the run
    python -m tepo_verl.report.runs keep-segments "$metrics_file" "$output_dir/$experiment/checkpoints" "${args[@]}" "$@"
  fi
  exec python -m verl.trainer.main_ppo "${args[@]}" "$@"
}
