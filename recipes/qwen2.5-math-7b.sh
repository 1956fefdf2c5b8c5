#!/usr/bin/env bash
# Qwen2.5-Math-7B on DAPO-Math-17k, 1 node x 8 GPUs (80 GB). ALGO=tepo|tepo_nomask|gspo|grpo|dapo (recipes/common.sh).
# All values are ours (common public settings for this model); the reasoning is in docs/recipes.md.
# - Context: 4096 tokens (max_position_embeddings), so 1024 prompt + 3072 response; longer is refused.
# - Batch: 128 prompts x 8 samples per step, mini-batch 32 prompts (4 updates per step), lr 1e-6.
# - Rollout TP 1 (8 replicas, no tensor-parallel all-reduce): at 4k context one GPU holds a replica. bf16 weights
#   15.2 GB; gpu_memory_utilization 0.6 = 48 GB (verl's 7B example value without offload) leaves ~30 GB of KV cache
#   at 56 KiB/token = 0.54M tokens per replica, the worst case of its 128 sequences x 4096 tokens. Resident during
#   rollout: 48 + 15.2 (actor fp32 params + grads + Adam, 16 bytes/param sharded over 8) + ~5 = ~68 GB of 80.
# - Token budgets per GPU: training 4 x 4096 = 16384 (peak ~33 GB), log-prob passes 1.5x = 24576 (~28 GB).
# - Validation during training: full suite, 1 sample, every 10 steps = 79k generations (15% of 512k training ones).
#   Checkpoints: 91 GB each (12 bytes/parameter), every 50 steps, 2 kept = 183 GB per run.
MODEL_DEFAULT_PATH=Qwen/Qwen2.5-Math-7B
MODEL_DEFAULT_CONTEXT=4096
MODEL_TAG=qwen2.5-math-7b
MODEL_NNODES=1
MODEL_TRAIN_BATCH_SIZE=128
MODEL_MINI_BATCH_SIZE=32
MODEL_MAX_PROMPT_LENGTH=1024
MODEL_MAX_RESPONSE_LENGTH=3072
MODEL_TRAIN_TOKEN_FACTOR=4
MODEL_ROLLOUT_TP=1
MODEL_GPU_MEMORY_UTILIZATION=0.6
MODEL_OFFLOAD=0
MODEL_TOTAL_STEPS=500
MODEL_TEST_FREQ=10
MODEL_VAL_MAX_SAMPLES=-1
MODEL_SAVE_FREQ=50
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
