#!/usr/bin/env bash
# The TEPO paper's setup with Qwen2.5-7B (base), 1 node x 8 GPUs (80 GB). ALGO=tepo|tepo_nomask|gspo|grpo|dapo.
#
# From the paper (section 4.1 / Table 4 as reported by a third-party reading of the full text, a secondary source,
# not the authors' code or our own reading): Qwen2.5-7B; DAPO-Math-17k; 64 prompts x 8 samples per step; 8 updates
# per step (mini-batches of 8 prompts, so every update after the first is off-policy); responses up to 8192 tokens;
# two seeds (run SEED=1 and SEED=2).
# Ours (not in that source): 2048 prompt tokens, lr 1e-6 with 10 warm-up steps, weight decay 0.1, gradient clip 1.0,
# rollout temperature 1.0, 300 steps, and everything below. Reasoning in docs/recipes.md.
# - Rollout TP 2 (4 replicas of 128 sequences): with 8192-token responses a step waits for its longest response, and
#   TP 2 roughly halves the per-token decode latency of that tail. gpu_memory_utilization 0.6 = 48 GB: bf16 weights
#   7.6 GB per GPU, ~38 GB of KV cache at 28 KiB/token per GPU = 1.32M tokens per replica, the worst case of
#   128 sequences x 10240 tokens. No offload: actor fp32 params + grads + Adam = 16 bytes/param / 8 GPUs = 15.2 GB
#   resident, so ~68 GB in use during rollout.
# - Token budgets per GPU: training 2 x 10240 = 20480 (peak ~37 GB: states 15.2, checkpointed activations 4.1,
#   logits and their gradient 12.4), log-prob passes 1.5x = 30720. No sequence parallelism: one 10240-token sequence
#   fits a GPU with room to spare (budgets are per GPU with or without it).
# - Validation during training: full suite, 1 sample, every 20 steps = 16 x 1547 = 25k generations (16% of the
#   154k training generations). Checkpoints: 91 GB each, every 50 steps, 2 kept = 183 GB per run.
MODEL_DEFAULT_PATH=Qwen/Qwen2.5-7B
MODEL_DEFAULT_CONTEXT=32768
MODEL_TAG=qwen2.5-7b
MODEL_NNODES=1
MODEL_TRAIN_BATCH_SIZE=64        # paper
MODEL_MINI_BATCH_SIZE=8          # paper: 8 updates per step
MODEL_MAX_PROMPT_LENGTH=2048     # ours
MODEL_MAX_RESPONSE_LENGTH=8192   # paper
MODEL_TRAIN_TOKEN_FACTOR=2
MODEL_ROLLOUT_TP=2
MODEL_GPU_MEMORY_UTILIZATION=0.6
MODEL_OFFLOAD=0
MODEL_TOTAL_STEPS=300            # ours: over twice the ~132 steps the paper's baseline needed to reach its target
MODEL_TEST_FREQ=20
MODEL_VAL_MAX_SAMPLES=-1
MODEL_SAVE_FREQ=50
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
