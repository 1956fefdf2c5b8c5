#!/usr/bin/env bash
# Qwen2.5-Math-1.5B on DAPO-Math-17k, 1 node x 8 GPUs. ALGO=tepo|grpo|dapo|tepo_nomask (see recipes/common.sh).
# Qwen2.5-Math models have a 4k context: 1024 prompt + 3072 response tokens (as in Dr.GRPO / SimpleRL-Zoo).
# 128 prompts x 8 samples per step, mini-batch 32 prompts (4 updates per step), lr 1e-6 (DAPO, verl examples).
MODEL_DEFAULT_PATH=Qwen/Qwen2.5-Math-1.5B
MODEL_TAG=qwen2.5-math-1.5b
MODEL_TRAIN_BATCH_SIZE=128
MODEL_MINI_BATCH_SIZE=32
MODEL_MAX_PROMPT_LENGTH=1024
MODEL_MAX_RESPONSE_LENGTH=3072
MODEL_MAX_TOKENS_PER_GPU=16384
MODEL_ROLLOUT_TP=1
MODEL_TOTAL_STEPS=500
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
