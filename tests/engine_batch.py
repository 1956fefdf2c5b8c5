"""Batches shaped exactly as verl 0.9's engine hands them to the actor loss, built with verl's own functions.

`mini_batch()` builds the trainer-side padded batch (prompts left-padded, responses right-padded, old log-probs,
advantages, the old-policy `entropy` the v1 trainer stores), converts it with verl's `left_right_2_no_padding`,
assigns the global batch info the FSDP engine assigns, and splits it with verl's `prepare_micro_batches`.
`model_output()` lays a (B, T) log-prob leaf out as the engine's no-padding model output (a jagged nested tensor
over prompt + response tokens, shifted by one), so gradients reach the leaf through verl's `no_padding_2_padding`.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.engine.utils import prepare_micro_batches
from verl.workers.utils.padding import left_right_2_no_padding


def mini_batch(batch, prompt_lens, *, ref_log_prob=None, is_weights=None, store_old_entropy=True,
               dp_size=1, batch_num_tokens=None, global_batch_size=None, micro_batch_size=None) -> TensorDict:
    B, R = batch.response_mask.shape
    P = max(prompt_lens)
    prompt_mask = torch.zeros(B, P, dtype=torch.int64)
    for i, p in enumerate(prompt_lens):
        prompt_mask[i, P - p:] = 1  # left padding
    response_mask = batch.response_mask.to(torch.int64)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 100, (B, P), generator=g) * prompt_mask
    responses = torch.randint(3, 100, (B, R), generator=g) * response_mask
    fields = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "old_log_probs": batch.old_log_prob.detach(),
        "advantages": batch.advantages.detach(),
    }
    if store_old_entropy:
        fields["entropy"] = batch.old_entropy.detach()
    if ref_log_prob is not None:
        fields["ref_log_prob"] = ref_log_prob.detach()
    if is_weights is not None:
        fields["rollout_is_weights"] = is_weights.detach()
    data = left_right_2_no_padding(TensorDict(fields, batch_size=[B]))
    tokens = int(response_mask.sum()) if batch_num_tokens is None else batch_num_tokens
    tu.assign_non_tensor(
        data,
        dp_size=dp_size,
        batch_num_tokens=tokens,
        global_batch_size=B if global_batch_size is None else global_batch_size,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=B if micro_batch_size is None else micro_batch_size,
    )
    return data


def micro_batches(data: TensorDict):
    batches, _ = prepare_micro_batches(data)
    return batches


def model_output(log_prob_rows: torch.Tensor, entropy_rows: torch.Tensor | None, data: TensorDict) -> dict:
    """Lay (b, R) response log-probs (and entropies) out as the engine's nested no-padding model output."""
    prompt_lens = data["prompts"].offsets().diff() if data["prompts"].is_nested else data["attention_mask"][
        :, : data["prompts"].shape[1]].sum(-1)
    response_lens = data["response_mask"].sum(-1)

    def lay_out(rows: torch.Tensor) -> torch.Tensor:
        pieces, offsets = [], [0]
        for i in range(rows.shape[0]):
            p, r = int(prompt_lens[i]), int(response_lens[i])
            filler = torch.full((p - 1,), -7.0, dtype=rows.dtype)
            pieces += [filler, rows[i, :r], torch.full((1,), -7.0, dtype=rows.dtype)]
            offsets.append(offsets[-1] + p + r)
        values = torch.cat(pieces)
        return torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor(offsets))

    output = {"log_probs": lay_out(log_prob_rows)}
    if entropy_rows is not None:
        output["entropy"] = lay_out(entropy_rows)
    return output
