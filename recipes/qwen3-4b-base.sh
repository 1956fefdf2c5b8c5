#!/usr/bin/env bash
# Qwen3-4B-Base on DAPO-Math-17k, 1 node x 8 GPUs (80 GB). ALGO=tepo|tepo_nomask|gspo|grpo|dapo (recipes/common.sh).
# For Qwen3-8B-Base: MODEL_PATH=Qwen/Qwen3-8B-Base ROLLOUT_TP=2. All values are ours; reasoning in docs/recipes.md.
# - Lengths: 2048 prompt + 8192 response tokens (Qwen3 base models reason at length) of a 32768-token context.
# - Batch: 128 prompts x 8 samples per step, mini-batch 32 prompts (4 updates per step), lr 1e-6.
# - Rollout TP 1 (8 replicas): bf16 weights 8 GB. gpu_memory_utilization 0.7 = 56 GB: ~46 GB of KV cache at 144 KiB/token
#   (36 layers x 8 KV heads) = 0.33M tokens per replica, ~2.5k tokens for each of its 128 sequences at once (vLLM
#   preempts and recomputes beyond that, slower but correct). Resident during rollout: 56 + 8 (actor states) + ~5 = ~69 GB.
# - Token budgets per GPU: training 2 x 10240 = 20480 (peak ~27 GB), log-prob passes 1.5x = 30720.
# - Validation during training: full suite, 1 sample, every 10 steps = 41 x 1547 = 63k generations (15% of 410k).
#   Checkpoints: 48 GB each, every 50 steps, 2 kept.
MODEL_DEFAULT_PATH=Qwen/Qwen3-4B-Base
MODEL_DEFAULT_CONTEXT=32768
MODEL_TAG=qwen3-4b-base
MODEL_NNODES=1
MODEL_TRAIN_BATCH_SIZE=128
MODEL_MINI_BATCH_SIZE=32
MODEL_MAX_PROMPT_LENGTH=2048
MODEL_MAX_RESPONSE_LENGTH=8192
MODEL_TRAIN_TOKEN_FACTOR=2
MODEL_ROLLOUT_TP=1
MODEL_GPU_MEMORY_UTILIZATION=0.7
MODEL_OFFLOAD=0
MODEL_TOTAL_STEPS=400
MODEL_TEST_FREQ=10
MODEL_VAL_MAX_SAMPLES=-1
MODEL_SAVE_FREQ=50
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
