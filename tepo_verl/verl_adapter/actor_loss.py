"""The adapter around verl's actor loss `verl.workers.utils.losses.ppo_loss`.

verl's policy-loss registry passes a loss only (old_log_prob, log_prob, advantages, response_mask, ...); TEPO's mask
also needs the current-policy entropy (`model_output["entropy"]`, computed when `actor.calculate_entropy=True`), the
old-policy entropy (`data["entropy"]`, stored from the old-log-prob pass by verl's v1 trainer, and on the legacy
trainer by legacy_trainer.py) and, for `kl_target=ref`, the reference log-probs (`data["ref_log_prob"]`).
`tepo_aware_ppo_loss` pads those exactly as `ppo_loss` pads its own fields, hands them to the registered `tepo` loss
through a context variable, and calls the stock `ppo_loss` unchanged (so its entropy bonus, KL loss and metric
handling stay verl's). For every other loss mode it calls the stock `ppo_loss` directly: a no-op.

TEPO reads the current entropy as a value only. With `entropy_coeff=0` verl's `ppo_loss` would still subtract
0 * entropy from the loss and backpropagate zeros through the full-vocabulary entropy, so for `tepo` the adapter
replaces the engine's `model_output["entropy"]` by its detached copy before anything reads it: the update and every
metric are unchanged, the entropy's graph is freed before the backward and the backward skips it
(`DETACH_ENTROPY`; with `entropy_coeff != 0` verl's entropy bonus needs the gradient and keeps it).

For every loss mode it also says once per process, on stderr, when the log-probs' dtype cannot resolve the clip
range (tepo_verl/verl_adapter/precision.py): a bf16 ratio cannot express GSPO-scale clipping.
"""

from __future__ import annotations

import contextvars
import dataclasses
import sys
from typing import Any

import torch

from tepo_verl.import_hooks import STOCK, replace
from tepo_verl.verl_adapter import ratio_metric
from tepo_verl.verl_adapter.config import TEPO_LOSS_MODE, clip_ratios, loss_mode
from tepo_verl.verl_adapter.precision import precision_warning


@dataclasses.dataclass
class TepoExtras:
    """Tensors the plain registry call cannot carry, padded like ppo_loss's fields, each (B, T) or None."""

    entropy: torch.Tensor | None = None
    old_entropy: torch.Tensor | None = None
    ref_log_prob: torch.Tensor | None = None
    #: Metrics that need an aggregation other than verl's MEAN for policy-loss metrics (filled by the loss: the
    #: token-weighted ratios, the ratio min/max).
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


_EXTRAS: contextvars.ContextVar[TepoExtras | None] = contextvars.ContextVar("tepo_extras", default=None)

#: Modules besides verl.workers.utils.losses that bind `ppo_loss` by name (`from ... import ppo_loss`); one imported
#: after install() binds the adapter already.
_BINDING_MODULES = ("verl.workers.engine_workers", "verl.trainer.distillation.losses")


def current_extras() -> TepoExtras | None:
    return _EXTRAS.get()


def _padded(data, names: list[str]) -> dict[str, torch.Tensor]:
    """Pad `data`'s fields `names` exactly as ppo_loss pads old_log_probs (select + to_padded_tensor)."""
    present = [name for name in names if name in data.keys()]
    if not present:
        return {}
    padded = data.select("response_mask", *present).to_padded_tensor()
    return {name: padded[name] for name in present}


def extract_extras(model_output, data) -> TepoExtras:
    """The current entropy, old entropy and reference log-probs of one micro-batch, where present."""
    from verl.workers.utils.padding import no_padding_2_padding

    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
    stored = _padded(data, ["entropy", "ref_log_prob"])
    return TepoExtras(entropy=entropy, old_entropy=stored.get("entropy"), ref_log_prob=stored.get("ref_log_prob"))


_PRECISION_CHECKED = False


def warn_once_on_coarse_log_probs(config, model_output) -> None:
    """Print precision_warning's line once per process when the first micro-batch's log-probs call for it."""
    global _PRECISION_CHECKED
    if _PRECISION_CHECKED:
        return  # every later micro-batch of the process: one flag test
    log_probs = model_output.get("log_probs", None)
    if log_probs is None:
        return
    _PRECISION_CHECKED = True
    message = precision_warning(log_probs.dtype, *clip_ratios(config), loss_mode(config))
    if message:
        print(message, file=sys.stderr, flush=True)


#: Detach the current entropy for `tepo` when verl's entropy bonus is off (module docstring). A switch for benchmarks
#: that measure the step cost before and after; the product never turns it off.
DETACH_ENTROPY = True


def detach_entropy_in_place(config, model_output) -> None:
    """Replace the engine's current entropy by its detached copy when no verl loss term needs its gradient."""
    entropy = model_output.get("entropy", None)
    if DETACH_ENTROPY and entropy is not None and entropy.requires_grad and config.get("entropy_coeff", 0.0) == 0:
        model_output["entropy"] = entropy.detach()  # the engine's dict: the last reference to the entropy's graph


def tepo_aware_ppo_loss(config, model_output, data, dp_group=None):
    """Drop-in for verl's ppo_loss: identical for every loss mode except `tepo` (see the module docstring)."""
    warn_once_on_coarse_log_probs(config, model_output)
    stock_ppo_loss = tepo_aware_ppo_loss.__tepo_stock__
    if loss_mode(config) != TEPO_LOSS_MODE:
        return stock_ppo_loss(config, model_output, data, dp_group)
    ratio_metric.install()  # the first tepo loss of a process teaches verl's Metric to merge the tepo/ ratios
    detach_entropy_in_place(config, model_output)
    extras = extract_extras(model_output, data)
    token = _EXTRAS.set(extras)
    try:
        loss, metrics = stock_ppo_loss(config, model_output, data, dp_group)
    finally:
        _EXTRAS.reset(token)
    metrics.update(extras.metrics)
    return loss, metrics


def install() -> None:
    """Bind `tepo_aware_ppo_loss` wherever verl binds `ppo_loss` (idempotent)."""
    from verl.workers.utils import losses

    binding = [sys.modules[name] for name in _BINDING_MODULES if name in sys.modules]
    replace(losses, "ppo_loss", lambda stock: tepo_aware_ppo_loss, also_in=binding)


def stock_ppo_loss():
    """verl's original ppo_loss (for tests and the no-op path); None before install()."""
    return getattr(tepo_aware_ppo_loss, STOCK, None)
