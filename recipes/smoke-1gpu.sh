#!/usr/bin/env bash
# One-GPU smoke test: Qwen2.5-0.5B-Instruct, short responses, a few steps, to check an installation end to end
# on a single GPU (not a benchmark). ALGO=tepo|grpo|dapo|tepo_nomask.
MODEL_DEFAULT_PATH=Qwen/Qwen2.5-0.5B-Instruct
MODEL_TAG=qwen2.5-0.5b-smoke
MODEL_TRAIN_BATCH_SIZE=16
MODEL_MINI_BATCH_SIZE=8
MODEL_MAX_PROMPT_LENGTH=512
MODEL_MAX_RESPONSE_LENGTH=1024
MODEL_MAX_TOKENS_PER_GPU=8192
MODEL_ROLLOUT_TP=1
MODEL_TOTAL_STEPS=5
GPUS_PER_NODE=${GPUS_PER_NODE:-1}
TEST_FREQ=${TEST_FREQ:-5}
VAL_N=${VAL_N:-2}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.4}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
