#!/usr/bin/env bash
# Qwen3-4B-Base on DAPO-Math-17k, 1 node x 8 GPUs. ALGO=tepo|grpo|dapo|tepo_nomask.
# 2048 prompt + 8192 response tokens (Qwen3 base models reason at length), 128 prompts x 8 samples,
# mini-batch 32, lr 1e-6, rollout TP 1. For Qwen3-8B-Base: MODEL_PATH=Qwen/Qwen3-8B-Base ROLLOUT_TP=2.
MODEL_DEFAULT_PATH=Qwen/Qwen3-4B-Base
MODEL_TAG=qwen3-4b-base
MODEL_TRAIN_BATCH_SIZE=128
MODEL_MINI_BATCH_SIZE=32
MODEL_MAX_PROMPT_LENGTH=2048
MODEL_MAX_RESPONSE_LENGTH=8192
MODEL_MAX_TOKENS_PER_GPU=24576
MODEL_ROLLOUT_TP=1
MODEL_TOTAL_STEPS=400
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
