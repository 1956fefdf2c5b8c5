#!/usr/bin/env bash
# Shared body of the GPU recipes: FSDP actor + vLLM rollout on verl's stock entry point.
# A model recipe sets MODEL_* defaults and calls `run_recipe "$@"`. ALGO selects the preset and is the ONLY
# thing that differs between algorithms, so a comparison is fair by construction.
#
# Environment (defaults in brackets):
#   ALGO            tepo | grpo | dapo | tepo_nomask                                      [tepo]
#   MODEL_PATH      HF hub id or local folder                                             [the recipe's model]
#   DATA_DIR        folder of `python -m tepo_verl.data convert dapo_math_17k eval --out-dir DIR`  [$HOME/data/tepo-verl]
#   TRAIN_FILES     training parquet(s), a Hydra list is fine                             [$DATA_DIR/dapo_math_17k.parquet]
#   VAL_FILES       validation parquets (the benchmark suite)                              [six eval sets in $DATA_DIR]
#   NNODES, GPUS_PER_NODE                                                                  [1, 8]
#   ROLLOUT_TP      vLLM tensor-parallel size                                              [recipe]
#   OFFLOAD         1 = FSDP parameter + optimizer offload to CPU                          [0]
#   OUTPUT_DIR      checkpoints, validation generations, file-logger JSONL                 [$PWD/runs]
#   EXPERIMENT      experiment name                                                        [<algo>-<model tag>-seed<SEED>]
#   PROJECT         project name                                                           [tepo-verl]
#   LOGGER          verl loggers, e.g. console,file,wandb                                  [console,file]
#   SEED            data-loader / rollout seed                                             [1]
#   TEST_FREQ       validate every N steps                                                 [10]
#   VAL_N           samples per validation problem (avg@k, pass@k, maj@k)                  [8]
#   TOTAL_STEPS     training steps                                                         [recipe]
#   DRY_RUN=1       compose and print the full config (`--cfg job`) instead of training
# Extra command-line arguments are passed to verl last, so they override everything here.

set -euo pipefail

VALID_ALGOS=(tepo grpo dapo tepo_nomask)

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

run_recipe() {
  ALGO=${ALGO:-tepo}
  check_algo "$ALGO"
  MODEL_PATH=${MODEL_PATH-$MODEL_DEFAULT_PATH}
  check_model_path "$MODEL_PATH"

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
  local reward_file
  reward_file=$(python -c 'import tepo_verl.reward.math_reward as m; print(m.__file__)') \
    || die "cannot import tepo_verl (pip install -e . in this environment)"
  local offload=False
  [[ "${OFFLOAD:-0}" == 1 ]] && offload=True

  local args=(
    "algorithm=$ALGO"
    # --- data (DAPO-Math-17k training prompts; the six-benchmark validation suite)
    "data.train_files=$(hydra_list "$train_files")"
    "data.val_files=$(hydra_list "$val_files")"
    "data.prompt_key=prompt"
    "data.train_batch_size=${TRAIN_BATCH_SIZE:-$MODEL_TRAIN_BATCH_SIZE}"
    "data.max_prompt_length=$MODEL_MAX_PROMPT_LENGTH"
    "data.max_response_length=$MODEL_MAX_RESPONSE_LENGTH"
    "data.filter_overlong_prompts=True"
    "data.truncation=error"
    "data.seed=$seed"
    # --- model and FSDP actor
    "actor_rollout_ref.model.path=$MODEL_PATH"
    "actor_rollout_ref.model.use_remove_padding=True"
    "actor_rollout_ref.model.enable_gradient_checkpointing=True"
    "actor_rollout_ref.actor.strategy=fsdp"
    "actor_rollout_ref.actor.optim.lr=1e-6"
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10"
    "actor_rollout_ref.actor.optim.weight_decay=0.1"
    "actor_rollout_ref.actor.grad_clip=1.0"
    "actor_rollout_ref.actor.ppo_mini_batch_size=$MODEL_MINI_BATCH_SIZE"
    "actor_rollout_ref.actor.use_dynamic_bsz=True"
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$MODEL_MAX_TOKENS_PER_GPU"
    "actor_rollout_ref.actor.ppo_epochs=1"
    "actor_rollout_ref.actor.data_loader_seed=$seed"
    "actor_rollout_ref.actor.fsdp_config.param_offload=$offload"
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=$offload"
    "actor_rollout_ref.ref.fsdp_config.param_offload=$offload"
    # --- vLLM rollout: group size 8, temperature 1.0 for training, sampled validation
    "actor_rollout_ref.rollout.name=vllm"
    "actor_rollout_ref.rollout.mode=async"
    "actor_rollout_ref.rollout.n=8"
    "actor_rollout_ref.rollout.temperature=1.0"
    "actor_rollout_ref.rollout.top_p=1.0"
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP:-$MODEL_ROLLOUT_TP}"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${GPU_MEMORY_UTILIZATION:-0.7}"
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$MODEL_MAX_TOKENS_PER_GPU"
    "actor_rollout_ref.rollout.seed=$seed"
    "actor_rollout_ref.rollout.val_kwargs.n=${VAL_N:-8}"
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True"
    "actor_rollout_ref.rollout.val_kwargs.temperature=0.6"
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.95"
    # --- reward: math-verify, thread-safe (tepo_verl.reward)
    "reward.custom_reward_function.path=$reward_file"
    "reward.custom_reward_function.name=compute_score"
    # --- trainer: cluster shape, logging, validation every TEST_FREQ steps with the generations saved
    "trainer.nnodes=${NNODES:-1}"
    "trainer.n_gpus_per_node=${GPUS_PER_NODE:-8}"
    "trainer.project_name=$project"
    "trainer.experiment_name=$experiment"
    "trainer.logger=$(hydra_list "${LOGGER:-console,file}")"
    "trainer.val_before_train=True"
    "trainer.test_freq=${TEST_FREQ:-10}"
    "trainer.save_freq=${SAVE_FREQ:-50}"
    "trainer.total_training_steps=${TOTAL_STEPS:-$MODEL_TOTAL_STEPS}"
    "trainer.total_epochs=100"
    "trainer.default_local_dir=$output_dir/$experiment/checkpoints"
    "trainer.validation_data_dir=$output_dir/$experiment/val_generations"
  )
  export VERL_FILE_LOGGER_PATH=${VERL_FILE_LOGGER_PATH:-$output_dir/$experiment/metrics.jsonl}
  [[ "${DRY_RUN:-0}" == 1 ]] || mkdir -p "$output_dir/$experiment"
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    exec python -m verl.trainer.main_ppo "${args[@]}" "$@" --cfg job
  fi
  exec python -m verl.trainer.main_ppo "${args[@]}" "$@"
}
