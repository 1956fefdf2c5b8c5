"""Random TEPO micro-batches for tests: right-padded (B, T) tensors with lengths from 0 to T."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Batch:
    log_prob: torch.Tensor  # (B, T) leaf, requires grad
    old_log_prob: torch.Tensor  # (B, T)
    advantages: torch.Tensor  # (B, T) A_i broadcast over valid tokens
    response_mask: torch.Tensor  # (B, T) {0, 1}
    entropy: torch.Tensor  # (B, T) > 0
    old_entropy: torch.Tensor  # (B, T) > 0
    ref_log_prob: torch.Tensor  # (B, T)
    is_weights: torch.Tensor  # (B, T) > 0

    @property
    def lengths(self) -> list[int]:
        return [int(n) for n in self.response_mask.sum(-1)]


def random_batch(
    seed: int,
    batch_size: int,
    max_len: int,
    *,
    dtype: torch.dtype = torch.float64,
    drift: float = 0.3,
    lengths: list[int] | None = None,
) -> Batch:
    """Lengths default to random in [1, max_len], except rows 0 and 1 (lengths 0 and 1) when batch_size > 2."""
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = torch.randint(1, max_len + 1, (batch_size,), generator=g).tolist()
        if batch_size > 2:
            lengths[0] = 0
            lengths[1] = min(1, max_len)
    mask = torch.zeros(batch_size, max_len, dtype=dtype)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    old = -torch.rand(batch_size, max_len, generator=g, dtype=dtype) * 3 - 0.01
    new = old + drift * torch.randn(batch_size, max_len, generator=g, dtype=dtype)
    adv_row = torch.randn(batch_size, 1, generator=g, dtype=dtype)
    adv_row[torch.rand(batch_size, 1, generator=g) < 0.2] = 0.0
    entropy = torch.rand(batch_size, max_len, generator=g, dtype=dtype) * 3
    old_entropy = (entropy + 0.5 * torch.randn(batch_size, max_len, generator=g, dtype=dtype)).abs()
    ref = old + 0.2 * torch.randn(batch_size, max_len, generator=g, dtype=dtype)
    weights = torch.rand(batch_size, max_len, generator=g, dtype=dtype) + 0.5
    return Batch(
        log_prob=new.clone().requires_grad_(True),
        old_log_prob=old,
        advantages=adv_row * mask,
        response_mask=mask,
        entropy=entropy,
        old_entropy=old_entropy,
        ref_log_prob=ref,
        is_weights=weights,
    )
