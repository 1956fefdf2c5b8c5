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

The hooks attach to `verl.trainer.ppo.v1.trainer_base` when that module is imported (only the driver's trainer
imports it), so the other verl processes do not pay for importing it. They change nothing verl computes: the
entropy hook reads the tensors verl passes to its own `actor/entropy` aggregation, and the counting hook counts
the prompts verl submits. The legacy trainer (`trainer.use_v1=False`) logs none of these metrics.
"""

from __future__ import annotations

import contextvars
import functools

from tepo_verl.import_hooks import when_imported

ENTROPY_TOKEN_MEAN = "tepo_verl/entropy_token_mean"
PROMPTS_GENERATED = "tepo_verl/prompts_generated"
RESPONSES_GENERATED = "tepo_verl/responses_generated"
TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"

_COUNTS = "_tepo_verl_generated"  # trainer attribute: [prompts, responses] submitted since the last logged step
_ENTROPY_CAPTURE: contextvars.ContextVar[list | None] = contextvars.ContextVar("tepo_verl_entropy", default=None)


def token_mean(values, mask) -> float:
    """Mean of `values` over the tokens where `mask` is set (every valid token weighs the same)."""
    mask = mask.to(values.dtype)
    return float((values * mask).sum() / mask.sum())


def _stock(fn):
    return getattr(fn, "__tepo_stock__", fn)


def _wrapping(stock):
    def decorate(wrapper):
        functools.update_wrapper(wrapper, stock)
        wrapper.__tepo_stock__ = stock
        return wrapper

    return decorate


def patch_trainer_module(trainer_base) -> None:
    """Install the hooks on verl's v1 trainer module (idempotent)."""
    trainer = trainer_base.PPOTrainer

    stock_agg_loss = _stock(trainer_base.agg_loss)

    @_wrapping(stock_agg_loss)
    def agg_loss(*args, **kwargs):
        # trainer_base calls agg_loss once: to aggregate the old-log-prob pass's entropy into `actor/entropy`.
        holder = _ENTROPY_CAPTURE.get()
        if holder is not None:
            names = ("loss_mat", "loss_mask")
            values = dict(zip(names, args, strict=False)) | {k: kwargs[k] for k in names if k in kwargs}
            holder.append(token_mean(values["loss_mat"].detach(), values["loss_mask"]))
        return stock_agg_loss(*args, **kwargs)

    stock_old_log_prob = _stock(trainer._compute_old_log_prob)

    @_wrapping(stock_old_log_prob)
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

    stock_submit = _stock(trainer._submit_batch_to_rollout)

    @_wrapping(stock_submit)
    def _submit_batch_to_rollout(self, batch):
        result = stock_submit(self, batch)
        counts = self.__dict__.setdefault(_COUNTS, [0, 0])
        counts[0] += len(batch)
        counts[1] += len(batch) * int(self.config.actor_rollout_ref.rollout.n)
        return result

    stock_step = _stock(trainer.step)

    @_wrapping(stock_step)
    def step(self, metrics, timing_raw):
        result = stock_step(self, metrics, timing_raw)
        prompts, responses = self.__dict__.pop(_COUNTS, (0, 0))
        metrics[PROMPTS_GENERATED] = prompts
        metrics[RESPONSES_GENERATED] = responses
        return result

    trainer_base.agg_loss = agg_loss
    trainer._compute_old_log_prob = _compute_old_log_prob
    trainer._submit_batch_to_rollout = _submit_batch_to_rollout
    trainer.step = step


def install() -> None:
    """Patch the v1 trainer now if it is imported already, else as soon as it is."""
    when_imported(TRAINER_MODULE, patch_trainer_module)
