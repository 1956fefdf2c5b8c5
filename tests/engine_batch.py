"""Batches shaped exactly as verl 0.9's engine hands them to the actor loss, built with verl's own functions.

`mini_batch()` builds the trainer-side padded batch (prompts left-padded, responses right-padded, old log-probs,
advantages, the old-policy `entropy` the v1 trainer stores), converts it with verl's `left_right_2_no_padding`,
assigns the global batch info the FSDP engine assigns, and splits it with verl's `prepare_micro_batches`.
`model_output()` lays a (B, T) log-prob leaf out as the engine's no-padding model output (a jagged nested tensor
over prompt + response tokens, shifted by one), so gradients reach the leaf through verl's `no_padding_2_padding`.
`jagged_rows()` turns a mini-batch into the shape verl's v1 trainer hands the engine (rows kept unpadded), and
`run()` puts it all together as the engine's update loop does: one loss call and one backward per micro-batch.
"""

from __future__ import annotations

import torch
import verl.utils.attention_utils
from batches import Batch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.metric import Metric
from verl.workers.engine.utils import prepare_micro_batches
from verl.workers.utils.padding import left_right_2_no_padding

from tepo_lab.cpu.patches import patch_attention_padding

# verl 0.9.0 removes padding with flash-attn's helpers, which have CUDA wheels only: on CPU, as here, the CPU mode's
# fix hands it pure-torch ones (lab/tepo_lab/cpu/padding.py). verl 0.9.1 falls back by itself, and the fix keeps that.
patch_attention_padding(verl.utils.attention_utils)

#: Prompt lengths of the rows of a test batch (row r gets PROMPT_LENS[r % 8]).
PROMPT_LENS = [3, 2, 5, 1, 4, 2, 3, 6]


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


#: Fields of a mini-batch aligned with the response tokens (B, R).
RESPONSE_FIELDS = ("responses", "response_mask", "loss_mask", "old_log_probs", "advantages", "entropy", "ref_log_prob",
                   "rollout_is_weights")


def jagged_rows(data: TensorDict) -> TensorDict:
    """The mini-batch as verl's v1 trainer hands it to the engine: the prompt and every response field one jagged row
    per response, with no padded response width (no `max_response_len`), so verl pads each micro-batch to its own
    longest response. `mini_batch()` gives the padded layout instead, where every micro-batch keeps the width R."""
    def rows(tensor: torch.Tensor, lengths: torch.Tensor, *, left: bool) -> torch.Tensor:
        width = tensor.shape[1]
        pieces = [tensor[i, width - n:] if left else tensor[i, :n] for i, n in enumerate(lengths.tolist())]
        return torch.nested.as_nested_tensor(pieces, layout=torch.jagged)

    P = data["prompts"].shape[1]
    prompt_lens = data["attention_mask"][:, :P].sum(-1)  # (B,)
    response_lens = data["response_mask"].sum(-1)  # (B,)
    for key in RESPONSE_FIELDS:
        if key in data:
            data[key] = rows(data[key], response_lens, left=False)
    data["prompts"] = rows(data["prompts"], prompt_lens, left=True)  # left-padded
    return data.exclude("max_response_len", "attention_mask")


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


def run(loss_fn, config, batch: Batch, *, rows=None, n_micro=1, with_entropy=True, jagged=False, **mini_kwargs):
    """Run `loss_fn` over the micro-batches of rows `rows`, as the engine does; return losses and metrics.
    `jagged=True` hands the engine the v1 trainer's unpadded rows (`jagged_rows`).

    Gradients accumulate into batch.log_prob.grad (one backward per micro-batch, like gradient accumulation)."""
    rows = list(range(batch.response_mask.shape[0])) if rows is None else rows
    sub = Batch(**{k: getattr(batch, k)[rows] for k in ("log_prob", "old_log_prob", "advantages", "response_mask",
                                                         "entropy", "old_entropy", "ref_log_prob", "is_weights")})
    data = mini_batch(sub, [PROMPT_LENS[r % len(PROMPT_LENS)] for r in rows],
                      micro_batch_size=len(rows) // n_micro, **mini_kwargs)
    if jagged:
        data = jagged_rows(data)
    losses_, metrics, start = [], [], 0
    for mb in micro_batches(data):
        idx = [rows[k] for k in range(start, start + len(mb))]
        start += len(mb)
        out = model_output(batch.log_prob[idx], batch.entropy[idx] if with_entropy else None, mb)
        loss, m = loss_fn(config, out, mb)
        loss.backward()
        losses_.append(loss.detach())
        metrics.append(m)
    return torch.stack(losses_), metrics


def value(metric):
    """A logged metric's value: verl's Metric aggregated, or a plain number."""
    return metric.aggregate() if isinstance(metric, Metric) else metric


def fresh(batch: Batch) -> Batch:
    """The batch with its accumulated gradient cleared."""
    batch.log_prob.grad = None
    return batch
