"""Whether the actor's log-probs can resolve the loss's clip range, and the one-line warning when they cannot.

A PPO-style loss clips the ratio exp(l - l_old) at 1 - clip_ratio_low and 1 + clip_ratio_high. verl's built-in
losses compute that ratio in the dtype of the log-probs the actor hands them. On a GPU with flash-attn, verl's
cross-entropy returns float32 log-probs; without it (the CPU mode, or a GPU without flash-attn) the log-probs come
out in the FSDP compute dtype, bf16 by default. A bf16 number just below 1 has a spacing of 2^-8 = 3.9e-3, so a
bf16 ratio cannot express a clip range like GSPO's 3e-4 / 4e-4: the loss clips on rounded values. TEPO upcasts to
float32, but the log-probs it receives are already rounded.
"""

from __future__ import annotations

import torch

#: verl overrides that make the FSDP actor (and the reference model) compute, and so return log-probs, in float32.
FLOAT32_OVERRIDES = tuple(
    f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision={{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}}"
    for role in ("actor", "ref")
)


def ratio_resolution(dtype: torch.dtype) -> float:
    """The spacing of `dtype` just below 1: the smallest step a ratio near 1 can take (2^-8 for bf16)."""
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
            f"TEPO upcasts, from rounded log-probs). For float32 log-probs: on a GPU install flash-attn (verl's "
            f"cross-entropy then returns float32); on CPU pass {' '.join(FLOAT32_OVERRIDES)}")
