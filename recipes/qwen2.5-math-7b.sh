#!/usr/bin/env bash
# Qwen2.5-Math-7B on DAPO-Math-17k, 1 node x 8 GPUs (set NNODES for more). ALGO=tepo|grpo|dapo|tepo_nomask.
# 4k context (1024 + 3072), 128 prompts x 8 samples, mini-batch 32, lr 1e-6; rollout TP 2 for a 7B model.
MODEL_DEFAULT_PATH=Qwen/Qwen2.5-Math-7B
MODEL_TAG=qwen2.5-math-7b
MODEL_TRAIN_BATCH_SIZE=128
MODEL_MINI_BATCH_SIZE=32
MODEL_MAX_PROMPT_LENGTH=1024
MODEL_MAX_RESPONSE_LENGTH=3072
MODEL_MAX_TOKENS_PER_GPU=16384
MODEL_ROLLOUT_TP=2
MODEL_TOTAL_STEPS=500
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
