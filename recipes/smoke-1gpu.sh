#!/usr/bin/env bash
# One-GPU smoke test: Qwen2.5-0.5B-Instruct, short responses, 5 steps, to check an installation end to end on a single
# GPU (not a benchmark). ALGO=tepo|tepo_nomask|gspo|grpo|dapo. Needs a GPU of 24 GB or more: unsharded actor states
# 16 bytes/param = 7.9 GB, vLLM 0.4 of the GPU, training budget 4 x 1536 = 6144 tokens (logits 1.9 GB).
# Validation on a random 64 problems of the suite, before training and at step 5; no checkpoint before the last step.
MODEL_DEFAULT_PATH=Qwen/Qwen2.5-0.5B-Instruct
MODEL_DEFAULT_CONTEXT=32768
MODEL_TAG=qwen2.5-0.5b-smoke
MODEL_NNODES=1
MODEL_TRAIN_BATCH_SIZE=16
MODEL_MINI_BATCH_SIZE=8
MODEL_MAX_PROMPT_LENGTH=512
MODEL_MAX_RESPONSE_LENGTH=1024
MODEL_TRAIN_TOKEN_FACTOR=4
MODEL_ROLLOUT_TP=1
MODEL_GPU_MEMORY_UTILIZATION=0.4
MODEL_OFFLOAD=0
MODEL_TOTAL_STEPS=5
MODEL_TEST_FREQ=5
MODEL_VAL_MAX_SAMPLES=64
MODEL_SAVE_FREQ=5
GPUS_PER_NODE=${GPUS_PER_NODE:-1}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_recipe "$@"
