"""verl's actor loss and metric path, run on tiny CPU inputs: what the contract (contract.py) checks by behaviour.

`run_ppo_loss` calls verl's `ppo_loss` once on a two-response micro-batch laid out as verl's v1 trainer hands one to
the engine (response fields as jagged nested tensors, the model output as one nested tensor over prompt + response
tokens, the global-batch info as non-tensor entries), with a recording policy loss registered under a probe name for
the duration of the call. It records what ppo_loss handed that loss, what `config.global_batch_info` held when the loss
ran, which model-output keys ppo_loss read and what it returned; the contract compares that with what the adapter
reads. `carry_ratio_metric` carries tepo's RatioMetric through verl's `append_to_dict` and `reduce_metrics` as a step's
mini-batches are carried from the worker to the driver. Each takes a few milliseconds: both run in every process's
plugin load (docs/plugin.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

#: The name the recording loss is registered under while ppo_loss runs (removed afterwards).
PROBE_LOSS_MODE = "tepo_contract_probe"
#: The plain-float metric the recording loss returns; verl's ppo_loss is expected to wrap it as a MEAN Metric.
PROBE_METRIC, PROBE_METRIC_VALUE = "tepo_contract/probe", 0.25

# Two responses of 2 and 3 tokens (the second with a masked token), after prompts of 2 and 1 tokens.
_PROMPT_LENS, _RESPONSE_MASKS = (2, 1), ((1, 1), (1, 0, 1))
#: The global-batch info of the micro-batch (data) and the actor config's loss_scale_factor: values distinct from
#: anything ppo_loss could compute itself, so that the info the loss sees is known to come from these.
BATCH_INFO = {"dp_size": 2, "batch_num_tokens": 9, "global_batch_size": 4}
LOSS_SCALE_FACTOR = 7


class MissingModelOutput(KeyError):
    """ppo_loss asked the model output for a key the engine does not produce."""


class _RecordingOutput(dict):
    """The engine's model output, recording which keys ppo_loss reads."""

    def __init__(self, values: dict[str, torch.Tensor]):
        super().__init__(values)
        self.read: list[str] = []

    def __getitem__(self, key):
        self.read.append(key)
        if key not in self:
            raise MissingModelOutput(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.append(key)
        return super().get(key, default)


def one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


def _rows(start: float, step: float) -> list[torch.Tensor]:
    """One float64 row per response, of its length, with values distinct across fields and tokens."""
    out, k = [], 0
    for mask in _RESPONSE_MASKS:
        out.append(torch.tensor([start + step * (k + i) for i in range(len(mask))], dtype=torch.float64))
        k += len(mask)
    return out


def _nested(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _model_output_layout(rows: list[torch.Tensor]) -> torch.Tensor:
    """Response rows laid out as the engine's output over prompt + response tokens, shifted left by one token."""
    pieces = []
    for p, row in zip(_PROMPT_LENS, rows, strict=True):
        pieces.append(torch.cat([torch.full((p - 1,), -9.0, dtype=row.dtype), row, torch.full((1,), -9.0,
                                                                                             dtype=row.dtype)]))
    return _nested(pieces)


def micro_batch():
    """(data, model_output, log_prob (B, T)): the micro-batch, the engine's output for it, the log-probs it holds."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    prompts = [torch.arange(3, 3 + p) for p in _PROMPT_LENS]
    responses = [torch.arange(50, 50 + len(m)) for m in _RESPONSE_MASKS]
    fields = {
        "prompts": _nested(prompts),
        "responses": _nested(responses),
        "input_ids": _nested([torch.cat(pair) for pair in zip(prompts, responses, strict=True)]),
        "response_mask": _nested([torch.tensor(m) for m in _RESPONSE_MASKS]),
        "old_log_probs": _nested(_rows(-0.10, -0.01)),
        "advantages": _nested(_rows(0.50, -0.20)),
        "rollout_is_weights": _nested(_rows(1.01, 0.01)),
        "ref_log_prob": _nested(_rows(-0.30, -0.01)),
        "entropy": _nested(_rows(0.20, 0.03)),  # the old-policy entropy the v1 trainer stores; TEPO's mask reads it
    }
    data = TensorDict(fields, batch_size=[len(_PROMPT_LENS)])
    tu.assign_non_tensor(data, **BATCH_INFO)
    log_probs = _rows(-0.05, -0.02)
    output = {"log_probs": _model_output_layout(log_probs), "entropy": _model_output_layout(_rows(0.7, 0.01))}
    return data, output, _nested(log_probs).to_padded_tensor(0.0)


@dataclasses.dataclass
class PpoLossRun:
    """What verl's ppo_loss did with `micro_batch()` and the recording policy loss."""

    #: The tensors the policy loss should receive, by its keyword: each (B, T), padded as
    #: data.select(...).to_padded_tensor() pads them (the adapter pads the old entropy that way).
    expected: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    expected_batch_info: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: (positional arguments, keywords) of each call of the policy loss.
    calls: list[tuple[tuple, dict]] = dataclasses.field(default_factory=list)
    #: config.global_batch_info when the policy loss ran.
    batch_info: dict[str, Any] | None = None
    #: What verl's agg_loss said to the global-batch info as the keywords the TEPO loss passes (None: accepted).
    aggregation_error: str | None = None
    model_output_read: list[str] = dataclasses.field(default_factory=list)
    returned: Any = None
    #: Where the call failed ("import", "config", "registry", "model output", "before the policy loss", "after the
    #: policy loss"), and how.
    failed_at: str | None = None
    failure: str | None = None


def run_ppo_loss(ppo_loss: Callable, register_policy_loss: Callable, registry: dict, agg_loss: Callable) -> PpoLossRun:
    """Call `ppo_loss` (verl's, or a planted copy's) on micro_batch() with a recording policy loss."""
    from verl.workers.config import ActorConfig, PolicyLossConfig

    data, output, log_prob = micro_batch()
    padded = data.select("response_mask", "old_log_probs", "advantages", "rollout_is_weights").to_padded_tensor()
    run = PpoLossRun(
        expected={"log_prob": log_prob, "old_log_prob": padded["old_log_probs"], "advantages": padded["advantages"],
                  "response_mask": padded["response_mask"].bool(), "rollout_is_weights": padded["rollout_is_weights"]},
        expected_batch_info={**BATCH_INFO, "loss_scale_factor": LOSS_SCALE_FACTOR})
    try:
        config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                             loss_scale_factor=LOSS_SCALE_FACTOR,
                             policy_loss=PolicyLossConfig(loss_mode=PROBE_LOSS_MODE))
    except Exception as error:  # noqa: BLE001 - a changed ActorConfig is reported, not raised
        run.failed_at, run.failure = "config", one_line(error)
        return run

    def recording_loss(*args, **kwargs):
        run.calls.append((args, dict(kwargs)))
        loss_config = kwargs.get("config")
        info = dict(loss_config.get("global_batch_info", None) or {}) if loss_config is not None else {}
        run.batch_info = info
        try:  # as the TEPO loss aggregates (registry.compute_policy_loss_tepo), on a mask of the expected layout
            mask = run.expected["response_mask"]
            partial(agg_loss, loss_agg_mode=kwargs.get("loss_agg_mode", "token-mean"), **info)(
                torch.zeros(mask.shape, dtype=torch.float64), mask)
        except Exception as error:  # noqa: BLE001 - recorded for the contract
            run.aggregation_error = one_line(error)
        current = kwargs.get("log_prob")
        return (current * 0).sum() if isinstance(current, torch.Tensor) else torch.zeros(()), {
            PROBE_METRIC: PROBE_METRIC_VALUE}

    recording = _RecordingOutput(output)
    try:
        register_policy_loss(PROBE_LOSS_MODE)(recording_loss)
    except Exception as error:  # noqa: BLE001 - a changed registry is reported, not raised
        run.failed_at, run.failure = "registry", one_line(error)
        return run
    try:
        run.returned = ppo_loss(config, recording, data)
    except Exception as error:  # noqa: BLE001 - where it failed says which assumption broke
        if run.calls:
            run.failed_at = "after the policy loss"
        else:
            run.failed_at = "model output" if isinstance(error, MissingModelOutput) else "before the policy loss"
        run.failure = one_line(error)
    finally:
        registry.pop(PROBE_LOSS_MODE, None)
        run.model_output_read = recording.read
    return run


def carry_ratio_metric(append_to_dict: Callable, reduce_metrics: Callable) -> str | None:
    """Carry two mini-batches' RatioMetrics through append_to_dict and reduce_metrics; None when the step's value is
    their ratio of sums, else what happened instead."""
    from tepo_verl.verl_adapter.ratio_metric import RatioMetric

    try:
        collected: dict[str, Any] = {}
        for num, den in ((1.0, 2.0), (3.0, 4.0)):  # ratio of sums 4/6, mean of ratios 0.625
            append_to_dict(collected, {"tepo/ratio": RatioMetric(num, den)})
        kept = collected["tepo/ratio"]
        if not isinstance(kept, RatioMetric):
            return f"append_to_dict collected two RatioMetrics into a {type(kept).__name__}"
        value = reduce_metrics(collected)["tepo/ratio"]
    except Exception as error:  # noqa: BLE001 - reported
        return f"carrying a RatioMetric through append_to_dict and reduce_metrics failed: {one_line(error)}"
    if not isinstance(value, float | int) or abs(float(value) - 4 / 6) > 1e-12:
        return f"reduce_metrics reduced two RatioMetrics (1/2, 3/4) to {value!r}, not their ratio of sums 4/6"
    return None
