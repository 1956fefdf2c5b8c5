#!/usr/bin/env bash
# Qwen2.5-7B (base) on DAPO-Math-17k, 2 nodes x 8 GPUs by default. ALGO=tepo|grpo|dapo|tepo_nomask.
# Long responses for a 7B model with a 32k context: 2048 prompt + 8192 response tokens (DAPO's recipe uses
# 20k for 32B; 8k is the common 7B setting), 128 prompts x 8 samples, mini-batch 32, lr 1e-6, rollout TP 2.
MODEL_DEFAULT_PATH=Qwen/Qwen2.5-7B
MODEL_TAG=qwen2.5-7b
MODEL_TRAIN_BATCH_SIZE=128
MODEL_MINI_BATCH_SIZE=32
MODEL_MAX_PROMPT_LENGTH=2048
MODEL_MAX_RESPONSE_LENGTH=8192
MODEL_MAX_TOKENS_PER_GPU=24576
MODEL_ROLLOUT_TP=2
MODEL_TOTAL_STEPS=400
NNODES=${NNODES:-2}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
