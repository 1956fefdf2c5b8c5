#!/usr/bin/env bash
# The TEPO paper's setup with Qwen3-14B, 1 node x 8 GPUs (80 GB). ALGO=tepo|tepo_nomask|gspo|grpo|dapo|...,
# ENGINE=fsdp (default) or megatron.
#
# From the paper (section 4.1 / Table 4 as reported by a third-party reading of the full text, a secondary source,
# not the authors' code or our own reading): Qwen3-14B; DAPO-Math-17k; 64 prompts x 8 samples per step; 8 updates
# per step (mini-batches of 8 prompts); responses up to 8192 tokens; two seeds (run SEED=1 and SEED=2).
# Ours (not in that source): 2048 prompt tokens, lr 1e-6 with 10 warm-up steps, weight decay 0.1, gradient clip 1.0,
# rollout temperature 1.0, 300 steps, and everything below. Reasoning in docs/recipes.md.
# Qwen3-14B is used as the tokenizer's chat template renders it (enable_thinking is not set).
# - Offload on: the actor's fp32 params + grads + Adam are 16 bytes/param x 14.8B / 8 GPUs = 29.6 GB per GPU; moved to
#   CPU during rollout (host RAM: ~180 GB per node), they leave room for vLLM's KV cache. Without offload vLLM could
#   have at most ~0.5 of each GPU.
# - Rollout TP 4 (2 replicas of 256 sequences): bf16 weights 7.4 GB per GPU and a lower per-token latency for the
#   8192-token tail. gpu_memory_utilization 0.7 = 56 GB: ~46 GB of KV cache at 40 KiB/token per GPU (40 layers x
#   8 KV heads / 4) = 1.1M tokens per replica, ~4.4k tokens for each of its 256 sequences at once (vLLM preempts
#   and recomputes beyond that: slower, not wrong).
# - Token budgets per GPU: training 2 x 10240 = 20480 (peak ~57 GB: states 29.6, checkpointed activations 8.4,
#   logits and their gradient 12.4, one recomputed layer ~4), log-prob passes 1.5x = 30720. No sequence
#   parallelism: one 10240-token sequence fits a GPU.
# - Validation during training: full suite, 1 sample, every 20 steps = 25k generations (16% of 154k training ones).
#   Checkpoints: 177 GB each (12 bytes/parameter), every 50 steps, 2 kept = 354 GB per run.
# - ENGINE=megatron: TP 4, PP 1, CP 1 (docs/recipes.md). Per GPU: bf16 params + fp32 grads 6 bytes/param / TP 4 =
#   22.2 GB, fp32 master + Adam 12 bytes/param sharded over all 8 GPUs (distributed optimizer) = 22.2 GB; offloaded
#   during rollout as above. One 10240-token sequence needs no context parallelism, and 14.8B fits without pipeline
#   stages (no bubbles). 40 query / 8 KV heads split evenly over TP 4.
MODEL_DEFAULT_PATH=Qwen/Qwen3-14B
MODEL_DEFAULT_CONTEXT=40960
MODEL_TAG=qwen3-14b
MODEL_NNODES=1
MODEL_TRAIN_BATCH_SIZE=64        # paper
MODEL_MINI_BATCH_SIZE=8          # paper: 8 updates per step
MODEL_MAX_PROMPT_LENGTH=2048     # ours
MODEL_MAX_RESPONSE_LENGTH=8192   # paper
MODEL_TRAIN_TOKEN_FACTOR=2
MODEL_ROLLOUT_TP=4
MODEL_GPU_MEMORY_UTILIZATION=0.7
MODEL_OFFLOAD=1
MODEL_TOTAL_STEPS=300            # ours
MODEL_TEST_FREQ=20
MODEL_VAL_MAX_SAMPLES=-1
MODEL_SAVE_FREQ=50
MODEL_MEGATRON_TP=4              # ENGINE=megatron only
MODEL_MEGATRON_PP=1
MODEL_MEGATRON_CP=1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
