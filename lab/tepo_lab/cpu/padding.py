"""Pure-torch padding helpers with the signatures and results of `flash_attn.bert_padding`, for the CPU mode.

verl removes padding before the actor's forward pass (`verl/workers/utils/padding.py`) with the helpers of
`verl.utils.attention_utils`, which take them from flash-attn on every device but an NPU. flash-attn ships CUDA
wheels only. verl 0.9.1 falls back to pure-torch helpers when flash-attn does not import; verl 0.9.0 has no such
fallback and fails with "No module named 'flash_attn'". The CPU mode hands verl these helpers instead
(patches.py, fix 7).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def index_first_axis(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """tensor (N, *rest), indices (n,) -> (n, *rest): the rows at `indices`, differentiable."""
    if tensor.ndim < 2:
        raise ValueError(f"index_first_axis needs a tensor of 2 or more dimensions, got shape {tuple(tensor.shape)}")
    return tensor[indices]


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """hidden_states (n, *rest) at flat positions `indices` of a (batch * seqlen) grid -> (batch, seqlen, *rest),
    zeros at every other position."""
    rest = hidden_states.shape[1:]
    padded = hidden_states.new_zeros(batch * seqlen, *rest)
    padded[indices] = hidden_states
    return padded.view(batch, seqlen, *rest)


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    """hidden_states (B, S, *rest), attention_mask (B, S) of 0/1 -> the tokens kept, in row-major order:

    (tokens (n, *rest), indices (n,) into the flattened (B * S) grid, cu_seqlens (B + 1,) int32 offsets of each
    row's tokens, the longest row's token count (int), used_seqlens (B,) int32 tokens per row in attention_mask).
    `unused_mask` (B, S) marks tokens that are kept but not attended to (counted in cu_seqlens, not in used_seqlens).
    """
    kept = attention_mask + unused_mask if unused_mask is not None else attention_mask  # (B, S)
    seqlens = kept.sum(dim=-1, dtype=torch.int32)  # (B,)
    used_seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)  # (B,)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()  # (n,)
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))  # (B + 1,)
    tokens = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)  # (n, *rest)
    return tokens, indices, cu_seqlens, int(seqlens.max().item()), used_seqlens


def rearrange(tensor, pattern: str, **axes):
    """`einops.rearrange` (flash-attn's own `rearrange` is einops'), imported on first use."""
    try:
        from einops import rearrange as einops_rearrange
    except ImportError as error:
        raise ImportError(f"verl asked for `rearrange`, which needs einops: pip install einops ({error})") from error
    return einops_rearrange(tensor, pattern, **axes)


#: In the order of verl's `_get_attention_functions()`.
HELPERS = (index_first_axis, pad_input, rearrange, unpad_input)
