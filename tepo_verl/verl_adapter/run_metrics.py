"""Per-step metrics that verl's v1 trainer logs in the same way for every preset, for `tepo-verl compare`.

verl does not log these in a form that is comparable across algorithms:

- `tepo_verl/entropy_token_mean`: the entropy of the old (rollout) policy, averaged over every valid response
  token of the step's batch (token-mean). verl's own `actor/entropy` is the same per-token entropy, from the
  same tensors (the old-log-prob pass at the rollout temperature), but aggregated with the actor's
  `loss_agg_mode`: `seq-mean-token-mean` (GRPO, GSPO) weighs a short response's tokens more than a long
  one's, `token-mean` (TEPO, DAPO) weighs every token alike. The two agree exactly under `token-mean`.
- `tepo_verl/prompts_generated`, `tepo_verl/responses_generated`: the prompts submitted for training rollouts
  during the step, and the responses that asks for (`rollout.n` per prompt): with DAPO's dynamic sampling, the
  regenerations that replace filtered groups count too. Validation generations do not.

Only a run that asks for them gets them: with TEPO_VERL_COMPARE_METRICS=1 in the trainer's environment (the
recipes set it and pass it to every Ray process), the hooks attach to `verl.trainer.ppo.v1.trainer_base` when
that module is imported (only the trainer imports it), so the other verl processes do not pay for importing it.
Without it nothing here touches verl. The hooks change nothing verl computes: the entropy hook reads the tensors
verl passes to its own `actor/entropy` aggregation, and the counting hook counts the prompts verl submits. The
legacy trainer (`trainer.use_v1=False`) logs none of these metrics.
"""

from __future__ import annotations

import contextvars
import functools
import os

from tepo_verl.import_hooks import replace, when_imported

ENTROPY_TOKEN_MEAN = "tepo_verl/entropy_token_mean"
PROMPTS_GENERATED = "tepo_verl/prompts_generated"
RESPONSES_GENERATED = "tepo_verl/responses_generated"
TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"
#: The variable a run sets to 1 to have these metrics logged.
ENV_FLAG = "TEPO_VERL_COMPARE_METRICS"

_COUNTS = "_tepo_verl_generated"  # trainer attribute: [prompts, responses] submitted since the last logged step
_ENTROPY_CAPTURE: contextvars.ContextVar[list | None] = contextvars.ContextVar("tepo_verl_entropy", default=None)


def token_mean(values, mask) -> float:
    """Mean of `values` over the tokens where `mask` is set (every valid token weighs the same)."""
    mask = mask.to(values.dtype)
    return float((values * mask).sum() / mask.sum())


class InvalidFlag(ValueError):
    pass


def requested(environ=None) -> bool:
    """Whether this process's run asked for the comparison metrics (ENV_FLAG=1)."""
    value = (os.environ if environ is None else environ).get(ENV_FLAG, "").strip()
    if value not in ("", "0", "1"):
        raise InvalidFlag(f"{ENV_FLAG}={value!r} is not valid; valid values: 1 (log the comparison metrics), 0 "
                          "or unset")
    return value == "1"


def _wrapping(wrapper_of):
    """make(stock) for import_hooks.replace: the wrapper built from the stock, looking like it (name, docstring)."""
    def make(stock):
        return functools.update_wrapper(wrapper_of(stock), stock)

    return make


def _capturing_agg_loss(stock_agg_loss):
    def agg_loss(*args, **kwargs):
        # trainer_base calls agg_loss once: to aggregate the old-log-prob pass's entropy into `actor/entropy`.
        holder = _ENTROPY_CAPTURE.get()
        if holder is not None:
            names = ("loss_mat", "loss_mask")
            values = dict(zip(names, args, strict=False)) | {k: kwargs[k] for k in names if k in kwargs}
            holder.append(token_mean(values["loss_mat"].detach(), values["loss_mask"]))
        return stock_agg_loss(*args, **kwargs)

    return agg_loss


def _logging_entropy(stock_old_log_prob):
    def _compute_old_log_prob(self, batch, metrics):
        holder: list[float] = []
        token = _ENTROPY_CAPTURE.set(holder)
        try:
            result = stock_old_log_prob(self, batch, metrics)
        finally:
            _ENTROPY_CAPTURE.reset(token)
        if holder:  # nothing when verl computed no entropy (rollout-correction bypass mode)
            metrics[ENTROPY_TOKEN_MEAN] = holder[-1]
        return result

    return _compute_old_log_prob


def _counting_submissions(stock_submit):
    def _submit_batch_to_rollout(self, batch):
        result = stock_submit(self, batch)
        counts = self.__dict__.setdefault(_COUNTS, [0, 0])
        counts[0] += len(batch)
        counts[1] += len(batch) * int(self.config.actor_rollout_ref.rollout.n)
        return result

    return _submit_batch_to_rollout


def _logging_counts(stock_step):
    def step(self, metrics, timing_raw):
        result = stock_step(self, metrics, timing_raw)
        prompts, responses = self.__dict__.pop(_COUNTS, (0, 0))
        metrics[PROMPTS_GENERATED] = prompts
        metrics[RESPONSES_GENERATED] = responses
        return result

    return step


def patch_trainer_module(trainer_base) -> None:
    """Install the hooks on verl's v1 trainer module (idempotent)."""
    trainer = trainer_base.PPOTrainer
    replace(trainer_base, "agg_loss", _wrapping(_capturing_agg_loss))
    replace(trainer, "_compute_old_log_prob", _wrapping(_logging_entropy))
    replace(trainer, "_submit_batch_to_rollout", _wrapping(_counting_submissions))
    replace(trainer, "step", _wrapping(_logging_counts))


def install(environ=None) -> bool:
    """When the run asked for them (ENV_FLAG=1): patch the v1 trainer now if it is imported already, else as soon
    as it is. Returns whether it did."""
    if not requested(environ):
        return False
    when_imported(TRAINER_MODULE, patch_trainer_module)
    return True
