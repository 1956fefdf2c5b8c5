"""Every assumption the adapter makes about verl, in one place, checked when the adapter starts relying on it.

The adapter (actor_loss.py, registry.py, ratio_metric.py, run_metrics.py, legacy_trainer.py, plugin.py) relies on
verl internals that are not a public API. Each `Assumption` below states one of them and checks it against the
installed verl. Where a call can show it, the check calls verl: its `ppo_loss` runs once on a two-response CPU
micro-batch with a recording policy loss, and a RatioMetric is carried through its `append_to_dict` and
`reduce_metrics` (contract_probe.py; a few milliseconds). What only verl's trainer and driver do cannot be called at
load (their module imports Ray and TransferQueue: seconds, in every process), so it is read from their source,
parsed, by what the code does (which keys a call writes, whatever the variable holding them; which names a module
imports and uses), not by its text.
An assumption's `scope` says when it is checked: most when the plugin loads; the comparison metrics' hooks only in a
run that asks for them; the legacy trainer's only for a config that runs `tepo` on it, in verl's validate_config (so
a v1 run is never refused for a change in the legacy trainer).

When verl no longer matches, `check_contract` raises `VerlContractError` with one line per broken assumption, naming
it and the installed verl version; the plugin then refuses `tepo` in the driver, before any worker starts, instead
of running a different algorithm. A user of a patched verl who has checked the change can set
`TEPO_VERL_CONTRACT=warn`: each broken assumption is then printed in one line naming it and the variable, and `tepo`
runs (docs/plugin.md).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tepo_verl.import_hooks import stock
from tepo_verl.verl_adapter.contract_probe import (
    PROBE_METRIC,
    PROBE_METRIC_VALUE,
    PpoLossRun,
    carry_ratio_metric,
    one_line,
    run_ppo_loss,
)

#: The verl release these assumptions were read from.
TESTED_VERL = "0.9.1"

#: The environment variable that lets `tepo` run on a verl that breaks the contract, and its values.
CONTRACT_VARIABLE = "TEPO_VERL_CONTRACT"
CONTRACT_MODES = ("enforce", "warn")

LOSSES = "verl.workers.utils.losses"
ENGINE_WORKERS = "verl.workers.engine_workers"
CORE_ALGOS = "verl.trainer.ppo.core_algos"
METRIC = "verl.utils.metric.utils"
PY_FUNCTIONAL = "verl.utils.py_functional"
MAIN_PPO = "verl.trainer.main_ppo"
TRAINER_BASE = "verl.trainer.ppo.v1.trainer_base"
LEGACY_TRAINER = "verl.trainer.ppo.ray_trainer"
MAIN_PPO_V0 = "verl.trainer.main_ppo_v0"

#: ppo_loss's parameters, in order (the adapter's drop-in has the same).
PPO_LOSS_PARAMETERS = ("config", "model_output", "data", "dp_group")
#: The keys of the engine's model output that ppo_loss reads; the adapter reads the current entropy (and the
#: log-probs' dtype) under the same keys.
MODEL_OUTPUT_KEYS = ("log_probs", "entropy")
#: The keywords ppo_loss passes to a registered policy loss (registry.compute_policy_loss_tepo accepts exactly these).
POLICY_LOSS_KEYWORDS = ("old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config",
                        "rollout_is_weights")
#: What config.global_batch_info holds when ppo_loss calls the policy loss; the TEPO loss passes them to verl's
#: agg_loss as keywords, so the loss is normalised over the global batch as verl's own losses are.
GLOBAL_BATCH_INFO_KEYS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")
#: The keys the v1 trainer's old-log-prob pass writes to the batch: TEPO's default mask reads the old entropy.
OLD_LOG_PROB_KEYS = ("old_log_probs", "entropy")
#: The keys the legacy trainer's old-log-prob pass returns (legacy_trainer.py keeps 'entropys' as 'entropy').
LEGACY_OLD_LOG_PROB_KEYS = ("old_log_probs", "entropys")
#: The v1 trainer methods run_metrics wraps, with their parameters.
TRAINER_HOOKS = {"_compute_old_log_prob": ("self", "batch", "metrics"), "_submit_batch_to_rollout": ("self", "batch"),
                 "step": ("self", "metrics", "timing_raw")}


class VerlContractError(RuntimeError):
    """verl no longer matches the adapter: one line per broken assumption."""


class SourceMissing(Exception):
    pass


class VerlSource:
    """The installed verl, as the checks see it: its modules, and their source parsed.

    `planted` replaces a module's text, or removes the module (None), as a changed verl would (tests): a planted
    module is executed from that text, under its name, into a fresh module object that is not registered in
    sys.modules (its own imports are the installed verl's). Planting suits modules whose classes nothing else
    refers to; a change to a class other modules import (verl's Metric) is tested in a copy of verl instead."""

    def __init__(self, planted: dict[str, str | None] | None = None):
        self._planted = dict(planted or {})
        self._trees: dict[str, ast.Module] = {}
        self._modules: dict[str, types.ModuleType] = {}
        self._memo: dict[str, Any] = {}

    @staticmethod
    def path(module: str) -> Path:
        spec = importlib.util.find_spec("verl")
        if spec is None or not spec.submodule_search_locations:
            raise SourceMissing("verl is not installed")
        base = Path(list(spec.submodule_search_locations)[0]).joinpath(*module.split(".")[1:])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        raise SourceMissing(f"module {module} is missing")

    def text(self, module: str) -> str:
        if module in self._planted:
            if self._planted[module] is None:
                raise SourceMissing(f"module {module} is missing")
            return self._planted[module]
        return self.path(module).read_text(encoding="utf-8")

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            self._trees[module] = ast.parse(self.text(module))
        return self._trees[module]

    def module(self, name: str) -> types.ModuleType:
        """The module `name`: the installed one, imported, or the planted text executed."""
        if name not in self._planted:
            return importlib.import_module(name)
        if name not in self._modules:
            text = self.text(name)
            module = types.ModuleType(name)
            module.__file__ = str(self.path(name))
            module.__package__ = name.rpartition(".")[0]
            exec(compile(text, module.__file__, "exec"), module.__dict__)  # noqa: S102 - verl's own (planted) source
            self._modules[name] = module
        return self._modules[name]

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """compute(), once per VerlSource: the checks that read one call of verl share it."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def function(self, module: str, name: str, cls: str | None = None) -> ast.FunctionDef:
        """The top-level function `name` of `module` (or the method `name` of its class `cls`), parsed."""
        scope: list[ast.stmt] = self.tree(module).body
        if cls is not None:
            found = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls), None)
            if found is None:
                raise SourceMissing(f"{module} defines no class {cls}")
            scope = found.body
        node = next((n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name),
                    None)
        if node is None:
            raise SourceMissing(f"{module} defines no {f'{cls}.' if cls else ''}{name}")
        return node


def verl_original(function: Callable) -> Callable:
    """verl's own function behind tepo-verl's replacement of it (`function` itself when it is verl's): the original
    every replacement keeps (tepo_verl/import_hooks.py)."""
    return stock(function)


# ------------------------------------------------------------------ AST helpers (for what cannot be called)

def _parameters(function: ast.FunctionDef) -> tuple[str, ...]:
    return tuple(a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs])


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Calls of `name(...)` or `<anything>.name(...)` inside node."""
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and _call_name(n) == name]


def _reads(call: ast.Call) -> bool:
    """A call that takes keys out of a batch (`pop`, `get`, `kv_batch_get`, ...) rather than writing them."""
    name = _call_name(call) or ""
    return name in ("get", "pop") or name.startswith("get_") or name.endswith("_get")


def _keys_handed(node: ast.AST) -> set[str]:
    """The string keys `node` hands on: literal strings, through lists, tuples, dicts and the arguments of calls that
    do not read, but not through subscripts or reading calls (`data.pop("entropy")` reads the key)."""
    if isinstance(node, ast.Constant):
        return {node.value} if isinstance(node.value, str) else set()
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return set().union(*(_keys_handed(e) for e in node.elts))
    if isinstance(node, ast.Dict):
        return set().union(*(_keys_handed(e) for e in [*node.keys, *node.values] if e is not None))
    if isinstance(node, ast.Starred):
        return _keys_handed(node.value)
    if isinstance(node, ast.Call) and not _reads(node):
        return set().union(*(_keys_handed(a) for a in [*node.args, *(k.value for k in node.keywords)]))
    return set()


def _keys_written(function: ast.FunctionDef) -> set[str]:
    """Every key a call in `function` that does not read is handed: what the function writes to the batch (a
    `select` of the fields to store, a store call), whatever variables hold the batch."""
    return set().union(*(_keys_handed(n) for n in ast.walk(function) if isinstance(n, ast.Call)))


def _imports_name(tree: ast.Module, module: str, name: str) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == name for a in n.names)
               for n in ast.walk(tree))


def _listed(expected, found) -> str:
    return f"expected {', '.join(expected) or 'none'}, found {', '.join(found) or 'none'}"


# ------------------------------------------------------------------ ppo_loss, called

#: Which assumption a failed ppo_loss call breaks, by where it failed (PpoLossRun.failed_at).
_FAILURE_OWNERS = {"import": "ppo_loss signature", "config": "ppo_loss signature", "registry": "policy-loss call",
                   "model output": "model output", "before the policy loss": "selected fields",
                   "after the policy loss": "metric format"}
_FAILURE_CONTEXT = {
    "import": f"cannot import {LOSSES}.ppo_loss or {CORE_ALGOS}'s policy-loss registry and agg_loss",
    "registry": "cannot register a policy loss with verl's register_policy_loss (as the tepo loss is registered)",
    "config": "cannot build the ActorConfig it takes (strategy, rollout_n, ppo_micro_batch_size_per_gpu, "
              "loss_scale_factor, policy_loss)",
    "model output": "ppo_loss asked the engine's model output for a key it does not hold",
    "before the policy loss": "ppo_loss failed before calling the policy loss, on a micro-batch holding the fields "
                              "and global-batch info verl's v1 trainer stores",
    "after the policy loss": "ppo_loss failed on the policy loss's result (a loss and plain-float metrics)",
}


def _ppo_loss_run(src: VerlSource, assumption: str) -> tuple[PpoLossRun | None, str | None]:
    """(the run, None) to check; (None, the failure) for the assumption a failed call breaks; (None, None) for the
    others (a failure is reported once). A call that failed after the policy loss ran still shows what that loss was
    handed: those checks run, and the failure is the metric format's only when they find nothing (a wrong input
    explains a failure downstream of it)."""
    def call() -> PpoLossRun:
        try:
            core_algos = src.module(CORE_ALGOS)
            verl_functions = (verl_original(src.module(LOSSES).ppo_loss), core_algos.register_policy_loss,
                              core_algos.POLICY_LOSS_REGISTRY, core_algos.agg_loss)
        except Exception as error:  # noqa: BLE001 - reported once, under its owner
            return PpoLossRun(failed_at="import", failure=one_line(error))
        return run_ppo_loss(*verl_functions)

    run = src.once("ppo_loss run", call)
    owner = _FAILURE_OWNERS.get(run.failed_at)
    if run.failed_at is None or (run.failed_at == "after the policy loss" and assumption != owner):
        return run, None
    if assumption != owner or (owner == "metric format" and any(check(src) for check in _INPUT_CHECKS)):
        return None, None
    unchecked = "" if run.calls else " (the other checks of this call could not run)"
    return None, f"{_FAILURE_CONTEXT[run.failed_at]}: {run.failure}{unchecked}"


def _differs(received: Any, expected, masked_by) -> str | None:
    """How a tensor the policy loss received differs from the expected (B, T) one, compared where the mask is set."""
    import torch

    if not isinstance(received, torch.Tensor) or received.is_nested:
        return f"a {type(received).__name__}{' (nested)' if isinstance(received, torch.Tensor) else ''}"
    if received.shape != expected.shape:
        return f"shape {tuple(received.shape)}, expected {tuple(expected.shape)}"
    left, right = received[masked_by].to(expected.dtype), expected[masked_by]
    if not (torch.equal(left, right) if expected.dtype == torch.bool else torch.allclose(left, right, rtol=1e-6)):
        return "other values"  # the fields' values differ by 0.01 or more: another field, or another layout
    return None


# ------------------------------------------------------------------ the assumptions

def _ppo_loss_signature(src: VerlSource) -> str | None:
    failure = _ppo_loss_run(src, "ppo_loss signature")[1]  # ppo_loss not importable, or its ActorConfig not built
    if failure:
        return failure
    parameters = inspect.signature(verl_original(src.module(LOSSES).ppo_loss)).parameters
    found = tuple(parameters)
    if found != PPO_LOSS_PARAMETERS:
        return f"ppo_loss's parameters changed: {_listed(PPO_LOSS_PARAMETERS, found)}"
    defaults = {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}
    if defaults != {"dp_group": None}:
        return f"ppo_loss's dp_group is no longer the only parameter with a default (None): defaults {defaults}"
    return None


def _ppo_loss_binding(src: VerlSource) -> str | None:
    tree = src.tree(ENGINE_WORKERS)
    by_name = _imports_name(tree, LOSSES, "ppo_loss") and any(
        isinstance(n, ast.Name) and n.id == "ppo_loss" and isinstance(n.ctx, ast.Load) for n in ast.walk(tree))
    module_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and n.module == LOSSES.rpartition(".")[0] for a in n.names if a.name == "losses"}
    through_module = any(isinstance(n, ast.Attribute) and n.attr == "ppo_loss" and isinstance(n.value, ast.Name)
                         and n.value.id in module_names for n in ast.walk(tree))
    if not (by_name or through_module):
        return (f"{ENGINE_WORKERS} no longer builds its actor loss from a name the adapter rebinds (its own "
                f"`ppo_loss`, imported from {LOSSES}, or `losses.ppo_loss`)")
    return None


def _model_output_keys(src: VerlSource) -> str | None:
    run, failure = _ppo_loss_run(src, "model output")
    if run is None:
        return failure
    missing = [key for key in MODEL_OUTPUT_KEYS if key not in run.model_output_read]
    if missing:
        return (f"ppo_loss no longer reads {', '.join(missing)} from the engine's model output "
                f"({_listed(MODEL_OUTPUT_KEYS, sorted(set(run.model_output_read)))})")
    (_, keywords), *_ = run.calls or [((), {})]
    if "log_prob" in keywords:
        problem = _differs(keywords["log_prob"], run.expected["log_prob"], run.expected["response_mask"])
        if problem:
            return f"the policy loss's log_prob is not model_output['log_probs'] laid out per response: {problem}"
    return None


def _selected_fields(src: VerlSource) -> str | None:
    run, failure = _ppo_loss_run(src, "selected fields")
    if run is None:
        return failure
    (_, keywords), *_ = run.calls or [((), {})]
    mask = run.expected["response_mask"]
    for name in ("response_mask", "old_log_prob", "advantages", "rollout_is_weights"):
        if name in keywords:  # a missing keyword is the policy-loss call's
            problem = _differs(keywords[name], run.expected[name], mask)
            if problem:
                return (f"the policy loss's {name} is not the micro-batch's field padded as "
                        f"data.select(...).to_padded_tensor() pads it, as the adapter pads the old entropy: {problem}")
    return None


def _policy_loss_call(src: VerlSource) -> str | None:
    run, failure = _ppo_loss_run(src, "policy-loss call")
    if run is None:
        return failure
    if len(run.calls) != 1:
        return f"ppo_loss called the registered policy loss {len(run.calls)} times on one micro-batch (expected once)"
    args, keywords = run.calls[0]
    if args or sorted(keywords) != sorted(POLICY_LOSS_KEYWORDS):
        found = [f"{len(args)} positional"] * bool(args) + sorted(keywords)
        return f"ppo_loss passes other arguments to the registered policy loss: {_listed(POLICY_LOSS_KEYWORDS, found)}"
    return None


def _global_batch_info(src: VerlSource) -> str | None:
    run, failure = _ppo_loss_run(src, "global batch info")
    if run is None:
        return failure
    if not run.calls:
        return None  # the policy-loss call's
    info = run.batch_info or {}
    differing = [f"{key}={info.get(key, 'missing')!r} (expected {value!r})"
                 for key, value in run.expected_batch_info.items() if info.get(key, "missing") != value]
    if differing:
        return ("config.global_batch_info, when ppo_loss calls the policy loss, does not hold the micro-batch's "
                f"global-batch info: {', '.join(differing)}")
    if run.aggregation_error:
        return ("verl's agg_loss does not take config.global_batch_info as keywords, as the TEPO loss passes it: "
                f"{run.aggregation_error}")
    return None


#: The checks of what ppo_loss hands the policy loss.
_INPUT_CHECKS = (_model_output_keys, _selected_fields, _policy_loss_call, _global_batch_info)


def _metric_format(src: VerlSource) -> str | None:
    run, failure = _ppo_loss_run(src, "metric format")
    if run is None:
        return failure
    metric_module = src.module(METRIC)
    Metric, AggregationType = metric_module.Metric, metric_module.AggregationType  # noqa: N806 - verl's classes
    returned = run.returned
    if not (isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[1], dict)):
        return f"ppo_loss no longer returns (loss, metrics dict): returned a {type(returned).__name__}"
    wrapped = returned[1].get(PROBE_METRIC)
    try:
        if not (isinstance(wrapped, Metric) and wrapped.aggregation == AggregationType.MEAN
                and float(wrapped.aggregate()) == PROBE_METRIC_VALUE):
            return (f"ppo_loss no longer wraps the policy loss's plain-float metrics as MEAN Metrics: "
                    f"{PROBE_METRIC}={PROBE_METRIC_VALUE} came back as {wrapped!r}")
        for aggregation in ("MIN", "MAX"):  # the adapter's ratio extremes
            if float(Metric(aggregation=getattr(AggregationType, aggregation), value=0.5).aggregate()) != 0.5:
                return f"verl's Metric(aggregation={aggregation}, value=0.5) no longer aggregates to 0.5"
    except Exception as error:  # noqa: BLE001 - reported
        return f"verl's Metric no longer works as the adapter uses it: {one_line(error)}"
    return None


def _step_metric_reduction(src: VerlSource) -> str | None:
    metric_module = src.module(METRIC)
    problem = carry_ratio_metric(src.module(PY_FUNCTIONAL).append_to_dict, metric_module.reduce_metrics)
    if problem:
        return problem
    if not isinstance(metric_module.Metric.__dict__.get("aggregate_dp"), classmethod):
        return "verl's Metric.aggregate_dp is no longer a classmethod (the adapter teaches it to merge RatioMetrics)"
    worker = src.function(ENGINE_WORKERS, "train_mini_batch", cls="TrainingWorker")
    if not _calls(worker, "aggregate_dp") or not _calls(worker, "append_to_dict"):
        return ("TrainingWorker.train_mini_batch no longer reduces a mini-batch's Metrics with Metric.aggregate_dp "
                "and collects the mini-batches with append_to_dict")
    if not _calls(src.function(TRAINER_BASE, "_update_actor", cls="PPOTrainer"), "reduce_metrics"):
        return "PPOTrainer._update_actor no longer logs the actor's metrics through reduce_metrics"
    return None


def _old_entropy(src: VerlSource) -> str | None:
    method = src.function(TRAINER_BASE, "_compute_old_log_prob", cls="PPOTrainer")
    written = _keys_written(method)
    if not set(OLD_LOG_PROB_KEYS) <= written:
        return ("the v1 trainer's old-log-prob pass (PPOTrainer._compute_old_log_prob) no longer writes "
                f"{' and '.join(repr(k) for k in OLD_LOG_PROB_KEYS)} to the batch (it writes "
                f"{', '.join(repr(k) for k in sorted(written & set(OLD_LOG_PROB_KEYS))) or 'neither'}); "
                "the default TEPO mask reads the old entropy")
    if not _imports_name(src.tree(MAIN_PPO), "verl.trainer.ppo.v1", "get_trainer_cls"):
        return f"{MAIN_PPO} no longer runs the v1 trainer (verl.trainer.ppo.v1.get_trainer_cls)"
    return None


def _trainer_hooks(src: VerlSource) -> str | None:
    for name, expected in TRAINER_HOOKS.items():
        found = _parameters(src.function(TRAINER_BASE, name, cls="PPOTrainer"))
        if found != expected:
            return f"PPOTrainer.{name}'s parameters changed: {_listed(expected, found)}"
    if not _imports_name(src.tree(TRAINER_BASE), CORE_ALGOS, "agg_loss"):
        return f"{TRAINER_BASE} no longer imports agg_loss from {CORE_ALGOS}"
    calls = _calls(src.function(TRAINER_BASE, "_compute_old_log_prob", cls="PPOTrainer"), "agg_loss")
    if len(calls) != 1 or not {"loss_mat", "loss_mask"} <= {k.arg for k in calls[0].keywords}:
        return ("PPOTrainer._compute_old_log_prob no longer aggregates the entropy with one "
                "agg_loss(loss_mat=, loss_mask=)")
    return None


def _legacy_old_entropy(src: VerlSource) -> str | None:
    method = src.function(LEGACY_TRAINER, "_compute_old_log_prob", cls="RayPPOTrainer")
    returned = _keys_written(method) | {key.value for node in ast.walk(method) if isinstance(node, ast.Dict)
                                        for key in node.keys if isinstance(key, ast.Constant)}
    if _parameters(method) != ("self", "batch") or not set(LEGACY_OLD_LOG_PROB_KEYS) <= returned:
        return ("the legacy trainer's old-log-prob pass (RayPPOTrainer._compute_old_log_prob(batch)) no longer returns "
                f"{' and '.join(repr(k) for k in LEGACY_OLD_LOG_PROB_KEYS)}")
    fit = src.function(LEGACY_TRAINER, "fit", cls="RayPPOTrainer")
    dropped = {arg.value for call in _calls(fit, "pop") for arg in call.args if isinstance(arg, ast.Constant)}
    if not _calls(fit, "_compute_old_log_prob") or not _calls(fit, "union") or "entropy" in dropped:
        return ("RayPPOTrainer.fit no longer merges its old-log-prob pass's result into the batch (union) without "
                "dropping an 'entropy' field")
    if not _imports_name(src.tree(MAIN_PPO_V0), "verl.utils.config", "validate_config"):
        return f"{MAIN_PPO_V0} no longer binds validate_config from verl.utils.config"
    run = src.function(MAIN_PPO_V0, "run", cls="TaskRunner")
    validated = [c.lineno for c in _calls(run, "validate_config")]
    built = [c.lineno for c in _calls(run, "RayPPOTrainer")]
    if not validated or not built or min(validated) > min(built):
        return f"{MAIN_PPO_V0}.TaskRunner.run no longer calls validate_config before it builds RayPPOTrainer"
    return None


def _driver_validation(src: VerlSource) -> str | None:
    tree = src.tree(MAIN_PPO)
    if not _imports_name(tree, "verl.utils.config", "validate_config"):
        return f"{MAIN_PPO} no longer binds validate_config from verl.utils.config"
    main = src.function(MAIN_PPO, "main")
    lines = [c.lineno for c in _calls(main, "validate_config")]
    runs = [c.lineno for c in _calls(main, "run_ppo")]
    if not lines or not runs or min(lines) > min(runs):
        return f"{MAIN_PPO}.main no longer calls validate_config before run_ppo (where the TEPO checks run)"
    return None


@dataclasses.dataclass(frozen=True)
class Assumption:
    name: str
    statement: str
    check: Callable[[VerlSource], str | None]  # None when verl matches, else what differs
    #: When the adapter relies on it, so when the plugin checks it: "load" (every run: when the plugin loads),
    #: "compare" (a run with TEPO_VERL_COMPARE_METRICS=1: at load), "legacy" (a config that runs `tepo` on the legacy
    #: trainer: in verl's validate_config, before the trainer is built).
    scope: str = "load"


#: Every scope of an Assumption.
SCOPES = ("load", "compare", "legacy")


ASSUMPTIONS = (
    Assumption("ppo_loss signature",
               f"{LOSSES}.ppo_loss(config, model_output, data, dp_group=None) is the loss every engine (FSDP, "
               "Megatron) calls; the adapter wraps it with a drop-in of the same signature", _ppo_loss_signature),
    Assumption("ppo_loss binding",
               f"{ENGINE_WORKERS} builds its actor loss from its own name ppo_loss (imported from {LOSSES}); the "
               "adapter rebinds that name", _ppo_loss_binding),
    Assumption("model output", "ppo_loss reads model_output['log_probs'] and model_output['entropy'] (the current "
               "entropy); the adapter reads the same keys", _model_output_keys),
    Assumption("selected fields", "on a micro-batch holding the fields the v1 trainer stores, ppo_loss hands the "
               "policy loss response_mask, old_log_probs, advantages and rollout_is_weights padded as "
               "data.select(...).to_padded_tensor() pads them; the adapter pads the old entropy and the reference "
               "log-probs the same way", _selected_fields),
    Assumption("policy-loss call", "ppo_loss calls the registered loss once, with the keywords "
               f"{', '.join(POLICY_LOSS_KEYWORDS)} and nothing else", _policy_loss_call),
    Assumption("global batch info", "when ppo_loss calls the policy loss, config.global_batch_info holds "
               f"{', '.join(GLOBAL_BATCH_INFO_KEYS)} of the micro-batch, and verl's agg_loss takes them as keywords",
               _global_batch_info),
    Assumption("metric format", "a policy loss returns plain-float metrics that ppo_loss wraps as MEAN Metrics; the "
               "adapter adds Metric(aggregation=MIN/MAX, value=float) entries to ppo_loss's metrics dict",
               _metric_format),
    Assumption("step metric reduction", "verl's append_to_dict collects a step's RatioMetrics into one RatioMetric "
               "and reduce_metrics reduces it with its own aggregate() (the tepo/ ratios are the step's ratio of "
               "sums); the worker merges each mini-batch's Metrics over ranks with Metric.aggregate_dp (which the "
               "adapter teaches to merge RatioMetrics)", _step_metric_reduction),
    Assumption("old entropy", "the v1 trainer's old-log-prob pass writes the old policy's entropy to the batch as "
               "'entropy' next to 'old_log_probs', and main_ppo runs that trainer", _old_entropy),
    Assumption("trainer hooks", "run_metrics wraps PPOTrainer._compute_old_log_prob(batch, metrics), "
               "_submit_batch_to_rollout(batch), step(metrics, timing_raw) and trainer_base's agg_loss",
               _trainer_hooks, scope="compare"),
    Assumption("legacy old entropy", "the legacy trainer's old-log-prob pass returns the old entropy as 'entropys' "
               "next to 'old_log_probs', which fit merges into the batch (legacy_trainer.py keeps it there as "
               "'entropy'), and main_ppo_v0's TaskRunner calls validate_config before it builds the trainer",
               _legacy_old_entropy, scope="legacy"),
    Assumption("driver validation", "main_ppo.main calls verl.utils.config.validate_config (which the plugin wraps "
               "with the TEPO checks) before it starts Ray", _driver_validation),
)


def installed_verl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("verl")
    except PackageNotFoundError:
        return "not installed"


def broken_assumptions(source: VerlSource | None = None,
                       scopes: tuple[str, ...] = SCOPES) -> list[tuple[Assumption, str]]:
    """(assumption, what differs) for every assumption of `scopes` the installed (or planted) verl breaks."""
    source = source or VerlSource()
    broken = []
    for assumption in ASSUMPTIONS:
        if assumption.scope not in scopes:
            continue
        try:
            problem = assumption.check(source)
        except Exception as error:  # noqa: BLE001 - a module that fails to import or parse breaks the assumption
            problem = str(error) if isinstance(error, SourceMissing) else one_line(error)
        if problem:
            broken.append((assumption, problem))
    return broken


def contract_mode() -> str:
    """TEPO_VERL_CONTRACT: `enforce` (the default) refuses tepo on a broken contract, `warn` runs it anyway."""
    mode = os.environ.get(CONTRACT_VARIABLE, "") or "enforce"
    if mode not in CONTRACT_MODES:
        raise VerlContractError(f"{CONTRACT_VARIABLE}={mode!r} is not valid; valid values: "
                                f"{', '.join(CONTRACT_MODES)} (unset means enforce)")
    return mode


def _broken_line(assumption: Assumption, problem: str, verl_version: str) -> str:
    return (f"tepo-verl's verl contract is broken ({assumption.name}): {' '.join(problem.split())}; installed verl "
            f"{verl_version}, tepo-verl was checked against verl {TESTED_VERL}.")


def contract_line(assumption: Assumption, problem: str, verl_version: str) -> str:
    return (f"{_broken_line(assumption, problem, verl_version)} TEPO would not run as documented, so it is refused "
            f"({CONTRACT_VARIABLE}=warn runs it anyway, on a patched verl you have checked).")


def warning_line(assumption: Assumption, problem: str, verl_version: str) -> str:
    return (f"[tepo-verl] WARNING: {_broken_line(assumption, problem, verl_version)} {CONTRACT_VARIABLE}=warn: "
            "TEPO runs anyway, unchecked on this point.")


def check_contract(source: VerlSource | None = None, scopes: tuple[str, ...] = SCOPES) -> None:
    """Raise VerlContractError (one line per broken assumption) unless the installed verl matches every one of
    `scopes`; with TEPO_VERL_CONTRACT=warn, print those lines as warnings on stderr instead and return."""
    mode = contract_mode()
    broken = broken_assumptions(source, scopes)
    if not broken:
        return
    verl_version = installed_verl_version()
    if mode == "warn":
        for assumption, problem in broken:
            print(warning_line(assumption, problem, verl_version), file=sys.stderr, flush=True)
        return
    raise VerlContractError("\n".join(contract_line(a, p, verl_version) for a, p in broken))
