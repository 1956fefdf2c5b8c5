#!/usr/bin/env bash
# Qwen2.5-Math-1.5B on DAPO-Math-17k, 1 node x 8 GPUs (80 GB). ALGO=tepo|tepo_nomask|gspo|grpo|dapo (recipes/common.sh).
# All values are ours (common public settings for this model); the reasoning is in docs/recipes.md.
# - Context: Qwen2.5-Math has a 4096-token context (max_position_embeddings), so 1024 prompt + 3072 response tokens
#   (as in Dr. GRPO / SimpleRL-Zoo); the recipe refuses a longer prompt + response.
# - Batch: 128 prompts x 8 samples per step, mini-batch 32 prompts (4 updates per step), lr 1e-6.
# - Rollout TP 1 (8 vLLM replicas): the bf16 weights are 3.1 GB. gpu_memory_utilization 0.6 = 48 GB for vLLM: KV cache
#   of ~43 GB at 28 KiB/token = 1.5M tokens per replica, against 128 sequences x 4096 = 0.52M needed at most.
#   Resident during rollout: 48 + 3.1 (actor fp32 params + grads + Adam, sharded over 8) + ~5 overheads = ~56 GB.
# - Token budgets per GPU: training 4 x 4096 = 16384 (peak ~16 GB), log-prob passes 1.5x = 24576.
# - Validation during training: full suite, 1 sample, every 10 steps = 51 x 1547 = 79k generations (15% of the
#   512k training generations). Checkpoints: 18.5 GB each (12 bytes/parameter), every 50 steps, 2 kept.
MODEL_DEFAULT_PATH=Qwen/Qwen2.5-Math-1.5B
MODEL_DEFAULT_CONTEXT=4096
MODEL_TAG=qwen2.5-math-1.5b
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
