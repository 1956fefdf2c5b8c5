"""Whether the actor's log-probs can resolve the loss's clip range, and the one-line warning when they cannot.

A PPO-style loss clips the ratio exp(l - l_old) at 1 - clip_ratio_low and 1 + clip_ratio_high. verl's built-in
losses compute that ratio in the dtype of the log-probs the actor hands them. A bf16 number just below 1 has a
spacing of 2^-8 = 3.9e-3, so a bf16 ratio cannot express a clip range like GSPO's 3e-4 / 4e-4: the loss clips on
rounded values. TEPO upcasts to float32, but from log-probs that are already rounded.

Where the dtype comes from in verl 0.9.1 (read in its source unless marked measured):
- `verl/workers/engine/fsdp/transformer_impl.py`, `FSDPEngineWithLMHead.forward_step`: the model and
  `prepare_model_outputs` (which computes log-probs and entropy) run inside `torch.autocast(device, param_dtype)`,
  bf16 by default, and without autocast when `mixed_precision.param_dtype` is fp32. The lm-head's logits are bf16.
- `verl/utils/torch_functional.py`, `logprobs_from_logits`: with flash-attn's Triton cross-entropy importable
  (and `VERL_DISABLE_FLASH_ATTN_CE` unset) it returns that kernel's float32 log-probs; otherwise
  `logprobs_from_logits_v2` calls `F.log_softmax` on the bf16 logits. CUDA autocast runs `log_softmax` in float32
  (PyTorch's autocast op reference), so a GPU gets float32 log-probs on both paths. CPU autocast has no such rule:
  the CPU mode gets bf16 (measured: torch 2.13's CPU autocast, and the warning in `tests/test_e2e_legacy.py`).
- Entropy: `entropy_from_logits` (softmax, then a product and a sum) comes out float32 under CUDA autocast by the
  same rule. With `use_fused_kernels` and the torch backend, `verl/utils/experimental/torch_functional.py`,
  `_fused_linear_for_ppo_fwd` returns float32 log-probs but casts the entropy back to the logits' dtype, bf16; the
  triton backend (`verl/utils/kernel/kernels.py`, `efficient_entropy_forward`) allocates both in float32.
- The logits are bf16 on every path, so a GPU's float32 log-probs resolve the clip range but are not bit-identical
  between the old-log-prob pass and the update, which pack micro-batches differently: the on-policy ratio is 1 plus
  noise. None of the GPU claims above has been measured yet; `benchmarks/gpu_check.py` measures them on a GPU.

The check below does not rely on this reasoning: the adapter reads the dtype of the first micro-batch's log-probs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: verl overrides that make the FSDP actor (and the reference model) compute, and so return log-probs, in float32.
FLOAT32_OVERRIDES = tuple(
    f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision={{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}}"
    for role in ("actor", "ref")
)


def ratio_resolution(dtype: torch.dtype) -> float:
    """The spacing of `dtype` just below 1: the smallest step a ratio near 1 can take (2^-8 for bf16)."""
    import torch  # here, not above: recipes/cpu.sh reads FLOAT32_OVERRIDES without paying torch's 2 s import

    return torch.finfo(dtype).eps / 2


def precision_warning(dtype: torch.dtype, clip_ratio_low: float, clip_ratio_high: float, loss_mode: str) -> str | None:
    """The warning line when log-probs of `dtype` cannot resolve the clip range, else None."""
    if not dtype.is_floating_point:
        return None
    resolution = ratio_resolution(dtype)
    if min(clip_ratio_low, clip_ratio_high) >= resolution:
        return None
    return (f"[tepo-verl] WARNING: the actor's log-probs arrive in {dtype}, where a ratio near 1 moves in steps of "
            f"{resolution:.1e}, coarser than the clip range {clip_ratio_low:g}/{clip_ratio_high:g} of "
            f"loss_mode={loss_mode}: the loss clips on rounded ratios (verl's built-in losses compute in that dtype; "
            f"TEPO upcasts, from rounded log-probs). For float32 log-probs pass {' '.join(FLOAT32_OVERRIDES)} "
            f"(verl's FSDP actor then runs without autocast). On a GPU verl's default path is float32 already (CUDA "
            f"autocast runs log_softmax in float32, flash-attn's cross-entropy returns float32), so bf16 there means "
            f"an engine path that computes log-probs outside CUDA autocast")
