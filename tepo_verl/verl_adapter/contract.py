"""Every assumption the adapter makes about verl, in one place, checked when the plugin loads.

The adapter (actor_loss.py, registry.py, run_metrics.py, plugin.py) relies on verl internals that are not a
public API. Each `Assumption` below states one of them and checks it against the installed verl's source, read
from its files (parsed, not imported: the v1 trainer module pulls in Ray and TransferQueue). When verl no longer
matches, `check_contract` raises `VerlContractError` with one line per broken assumption, naming it and the
installed verl version; the plugin then refuses `tepo` in the driver, before any worker starts, instead of running
a different algorithm. A check reads the code's shape (names, keywords, string keys), so a rewrite that keeps the
behaviour can trip it too: that is a false alarm to resolve by re-reading verl and updating this file, never a
reason to skip the check.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from collections.abc import Callable
from pathlib import Path

#: The verl release these assumptions were read from.
TESTED_VERL = "0.9.1"

LOSSES = "verl.workers.utils.losses"
ENGINE_WORKERS = "verl.workers.engine_workers"
CORE_ALGOS = "verl.trainer.ppo.core_algos"
METRIC = "verl.utils.metric.utils"
PY_FUNCTIONAL = "verl.utils.py_functional"
MAIN_PPO = "verl.trainer.main_ppo"
TRAINER_BASE = "verl.trainer.ppo.v1.trainer_base"

#: ppo_loss's parameters, in order (the adapter's drop-in has the same).
PPO_LOSS_PARAMETERS = ("config", "model_output", "data", "dp_group")
#: The fields ppo_loss selects from `data`: always, and when present. The adapter reads the old entropy
#: (`data["entropy"]`) itself, before ppo_loss drops every other field.
PPO_LOSS_FIELDS = ("response_mask", "old_log_probs", "advantages")
PPO_LOSS_OPTIONAL_FIELDS = ("rollout_is_weights", "ref_log_prob")
#: The keys ppo_loss reads from the model output; the adapter reads the current entropy and the log-probs' dtype.
MODEL_OUTPUT_KEYS = ("log_probs", "entropy")
#: The keywords ppo_loss passes to a registered policy loss (registry.compute_policy_loss_tepo accepts exactly these).
POLICY_LOSS_KEYWORDS = ("old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config",
                        "rollout_is_weights")
#: What ppo_loss writes into config.global_batch_info before calling the policy loss; the TEPO loss passes them
#: to verl's agg_loss as keywords, so the loss is normalised over the global batch as verl's own losses are.
GLOBAL_BATCH_INFO_KEYS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")
#: The v1 trainer methods run_metrics wraps, with their parameters.
TRAINER_HOOKS = {"_compute_old_log_prob": ("self", "batch", "metrics"), "_submit_batch_to_rollout": ("self", "batch"),
                 "step": ("self", "metrics", "timing_raw")}


class VerlContractError(RuntimeError):
    """verl no longer matches the adapter: one line per broken assumption."""


class SourceMissing(Exception):
    pass


class VerlSource:
    """The source of the installed verl's modules, parsed; `planted` replaces a module's text, or removes the
    module (None), as a changed verl would (tests)."""

    def __init__(self, planted: dict[str, str | None] | None = None):
        self._planted = dict(planted or {})
        self._trees: dict[str, ast.Module] = {}

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

    def function(self, module: str, name: str, cls: str | None = None) -> ast.FunctionDef:
        """The top-level function `name` of `module` (or the method `name` of its class `cls`)."""
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


# ------------------------------------------------------------------ AST helpers

def _parameters(function: ast.FunctionDef) -> tuple[str, ...]:
    return tuple(a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs])


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Calls of `name(...)` or `<anything>.name(...)` inside node."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            func = n.func
            if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) == name:
                out.append(n)
    return out


def _imports_name(tree: ast.Module, module: str, name: str) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == name for a in n.names)
               for n in ast.walk(tree))


def _listed(expected, found) -> str:
    return f"expected {', '.join(expected) or 'none'}, found {', '.join(found) or 'none'}"


# ------------------------------------------------------------------ the assumptions

def _ppo_loss_signature(src: VerlSource) -> str | None:
    function = src.function(LOSSES, "ppo_loss")
    found = _parameters(function)
    if found != PPO_LOSS_PARAMETERS:
        return f"ppo_loss's parameters changed: {_listed(PPO_LOSS_PARAMETERS, found)}"
    defaults = function.args.defaults
    if len(defaults) != 1 or not (isinstance(defaults[0], ast.Constant) and defaults[0].value is None):
        return "ppo_loss's dp_group is no longer the only parameter with a default (None)"
    return None


def _ppo_loss_binding(src: VerlSource) -> str | None:
    if not _imports_name(src.tree(ENGINE_WORKERS), LOSSES, "ppo_loss"):
        return f"{ENGINE_WORKERS} no longer binds ppo_loss by `from {LOSSES} import ppo_loss`"
    if not any(isinstance(a, ast.Name) and a.id == "ppo_loss"
               for call in _calls(src.tree(ENGINE_WORKERS), "partial") for a in call.args):
        return f"{ENGINE_WORKERS} no longer builds its actor loss as partial(ppo_loss, ...)"
    return None


def _model_output_key(node: ast.AST) -> list[str]:
    """The string key of `model_output[KEY]` or `model_output.get(KEY, ...)`, else nothing."""
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "model_output":
        return _strings(node.slice)
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "model_output.get" and node.args:
        return _strings(node.args[0])
    return []


def _model_output_keys(src: VerlSource) -> str | None:
    function = src.function(LOSSES, "ppo_loss")
    found = sorted({key for n in ast.walk(function) for key in _model_output_key(n)})
    if not set(MODEL_OUTPUT_KEYS) <= set(found):
        return f"ppo_loss reads other keys of model_output: {_listed(MODEL_OUTPUT_KEYS, found)}"
    return None


def _selected_fields(src: VerlSource) -> str | None:
    function = src.function(LOSSES, "ppo_loss")
    always: list[str] = []
    optional: list[str] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "fields" for t in node.targets):
            always += _strings(node.value)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("fields.append", "fields.extend"):
            optional += [s for a in node.args for s in _strings(a)]
    if tuple(always) != PPO_LOSS_FIELDS or sorted(optional) != sorted(PPO_LOSS_OPTIONAL_FIELDS):
        return ("ppo_loss selects other fields from data: "
                f"{_listed([*PPO_LOSS_FIELDS, *PPO_LOSS_OPTIONAL_FIELDS], [*always, *optional])}")
    padded = [ast.unparse(c) for c in _calls(function, "to_padded_tensor")]
    if "data.select(*fields).to_padded_tensor()" not in padded:
        return "ppo_loss no longer pads its fields with data.select(*fields).to_padded_tensor()"
    return None


def _policy_loss_call(src: VerlSource) -> str | None:
    calls = _calls(src.function(LOSSES, "ppo_loss"), "policy_loss_fn")
    if len(calls) != 1:
        return f"ppo_loss calls the registered policy loss {len(calls)} times (expected once, as policy_loss_fn)"
    found = tuple(k.arg for k in calls[0].keywords)
    if calls[0].args or sorted(found) != sorted(POLICY_LOSS_KEYWORDS):
        return f"ppo_loss passes other arguments to the registered policy loss: {_listed(POLICY_LOSS_KEYWORDS, found)}"
    return None


def _global_batch_info(src: VerlSource) -> str | None:
    function = src.function(LOSSES, "ppo_loss")
    call_line = min((c.lineno for c in _calls(function, "policy_loss_fn")), default=None)
    if call_line is None:
        return "ppo_loss no longer calls policy_loss_fn"
    filled: dict[str, int] = {}  # key -> line
    cleared: list[int] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and ast.unparse(target.value) == "config.global_batch_info":
                    filled.update({key: node.lineno for key in _strings(target.slice)})
                elif ast.unparse(target) == "config.global_batch_info":
                    cleared.append(node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "config.global_batch_info.clear", "config.global_batch_info.pop", "config.global_batch_info.update"):
            cleared.append(node.lineno)
    before_call = sorted(k for k, line in filled.items() if line < call_line)
    if before_call != sorted(GLOBAL_BATCH_INFO_KEYS):
        return ("ppo_loss fills other config.global_batch_info keys before the policy loss: "
                f"{_listed(GLOBAL_BATCH_INFO_KEYS, before_call)}")
    last_fill = max(filled[k] for k in GLOBAL_BATCH_INFO_KEYS)
    if any(last_fill < line < call_line for line in cleared):
        return "ppo_loss clears or replaces config.global_batch_info between filling it and calling the policy loss"
    agg = _parameters(src.function(CORE_ALGOS, "agg_loss"))
    missing = [k for k in GLOBAL_BATCH_INFO_KEYS if k not in agg]
    if missing:
        return f"verl's agg_loss no longer takes {', '.join(missing)} (the global batch info)"
    return None


def _metric_format(src: VerlSource) -> str | None:
    function = src.function(LOSSES, "ppo_loss")
    wraps = [c for c in _calls(function, "from_dict") if ast.unparse(c.func) == "Metric.from_dict"
             and c.args and ast.unparse(c.args[0]) == "pg_metrics"
             and any(k.arg == "aggregation" and ast.unparse(k.value) == "AggregationType.MEAN" for k in c.keywords)]
    if not wraps:
        return ("ppo_loss no longer wraps the policy loss's metrics (plain floats) with "
                "Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN)")
    returns = [ast.unparse(n.value) for n in ast.walk(function) if isinstance(n, ast.Return) and n.value is not None]
    if returns != ["(policy_loss, metrics)"]:
        return f"ppo_loss no longer returns (policy_loss, metrics): returns {', '.join(returns) or 'nothing'}"
    init = _parameters(src.function(METRIC, "__init__", cls="Metric"))
    if init[:3] != ("self", "aggregation", "value"):
        return f"verl's Metric(aggregation, value) constructor changed: parameters {', '.join(init)}"
    enum = next((n for n in src.tree(METRIC).body if isinstance(n, ast.ClassDef) and n.name == "AggregationType"),
                None)
    names = {t.id for n in (enum.body if enum else []) if isinstance(n, ast.Assign) for t in n.targets
             if isinstance(t, ast.Name)}
    if not {"MEAN", "MIN", "MAX"} <= names:
        return f"verl's AggregationType lacks MEAN, MIN or MAX: has {', '.join(sorted(names)) or 'none'}"
    return None


def _step_metric_reduction(src: VerlSource) -> str | None:
    worker = src.function(ENGINE_WORKERS, "train_mini_batch", cls="TrainingWorker")
    if not _calls(worker, "aggregate_dp") or not _calls(worker, "append_to_dict"):
        return ("TrainingWorker.train_mini_batch no longer reduces a mini-batch's Metrics with Metric.aggregate_dp "
                "and collects the mini-batches with append_to_dict")
    if not _calls(src.function(PY_FUNCTIONAL, "append_to_dict"), "init_list"):
        return "append_to_dict no longer collects a Metric value into the Metric's own init_list()"
    if not _calls(src.function(METRIC, "reduce_metrics"), "aggregate"):
        return "reduce_metrics no longer reduces a Metric value with its own aggregate()"
    update = src.function(TRAINER_BASE, "_update_actor", cls="PPOTrainer")
    if not _calls(update, "reduce_metrics"):
        return "PPOTrainer._update_actor no longer logs the actor's metrics through reduce_metrics"
    return None


def _old_entropy(src: VerlSource) -> str | None:
    method = src.function(TRAINER_BASE, "_compute_old_log_prob", cls="PPOTrainer")
    stored = [c for c in _calls(method, "select") if {"old_log_probs", "entropy"} <= set(_strings(c))]
    assigned = [n for n in ast.walk(method) if isinstance(n, ast.Assign)
                and any(ast.unparse(t) == "data['entropy']" for t in n.targets)]
    if not stored or not assigned:
        return ("the v1 trainer's old-log-prob pass (PPOTrainer._compute_old_log_prob) no longer stores the old "
                "entropy as data['entropy'] next to old_log_probs; the default TEPO mask reads it")
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


ASSUMPTIONS = (
    Assumption("ppo_loss signature",
               f"{LOSSES}.ppo_loss(config, model_output, data, dp_group=None) is the loss every engine (FSDP, "
               "Megatron) calls; the adapter wraps it with a drop-in of the same signature", _ppo_loss_signature),
    Assumption("ppo_loss binding",
               f"{ENGINE_WORKERS} imports ppo_loss by name and binds it with partial(); the adapter rebinds that name",
               _ppo_loss_binding),
    Assumption("model output", "ppo_loss reads model_output['log_probs'] and model_output.get('entropy') (the current "
               "entropy); the adapter reads the same keys", _model_output_keys),
    Assumption("selected fields", "ppo_loss keeps only response_mask, old_log_probs, advantages (and "
               "rollout_is_weights, ref_log_prob when present), padded by data.select(...).to_padded_tensor(); the "
               "adapter pads its extras the same way before the call", _selected_fields),
    Assumption("policy-loss call", "ppo_loss calls the registered loss with the keywords "
               f"{', '.join(POLICY_LOSS_KEYWORDS)} and nothing else", _policy_loss_call),
    Assumption("global batch info", "ppo_loss fills config.global_batch_info with "
               f"{', '.join(GLOBAL_BATCH_INFO_KEYS)} before calling the policy loss, which passes them to agg_loss",
               _global_batch_info),
    Assumption("metric format", "a policy loss returns plain-float metrics that ppo_loss wraps as MEAN Metrics; the "
               "adapter adds Metric(aggregation=MIN/MAX, value=float) entries to ppo_loss's metrics dict",
               _metric_format),
    Assumption("step metric reduction", "the worker merges each mini-batch's Metrics over ranks with "
               "Metric.aggregate_dp (which the adapter teaches to merge RatioMetrics) and collects the step's "
               "mini-batches with append_to_dict, which keeps a Metric a Metric; the driver's reduce_metrics reduces "
               "it with its aggregate(): the tepo/ ratios are logged as the step's ratio of sums",
               _step_metric_reduction),
    Assumption("old entropy", "the v1 trainer's old-log-prob pass stores the old policy's entropy as data['entropy'] "
               "next to old_log_probs, and main_ppo runs that trainer", _old_entropy),
    Assumption("trainer hooks", "run_metrics wraps PPOTrainer._compute_old_log_prob(batch, metrics), "
               "_submit_batch_to_rollout(batch), step(metrics, timing_raw) and trainer_base's agg_loss",
               _trainer_hooks),
    Assumption("driver validation", "main_ppo.main calls verl.utils.config.validate_config (which the plugin wraps "
               "with the TEPO checks) before it starts Ray", _driver_validation),
)


def installed_verl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("verl")
    except PackageNotFoundError:
        return "not installed"


def broken_assumptions(source: VerlSource | None = None) -> list[tuple[Assumption, str]]:
    """(assumption, what differs) for every assumption the installed (or planted) verl breaks."""
    source = source or VerlSource()
    broken = []
    for assumption in ASSUMPTIONS:
        try:
            problem = assumption.check(source)
        except (SourceMissing, SyntaxError, OSError) as error:
            problem = str(error)
        if problem:
            broken.append((assumption, problem))
    return broken


def contract_line(assumption: Assumption, problem: str, verl_version: str) -> str:
    return (f"tepo-verl's verl contract is broken ({assumption.name}): {problem}; installed verl {verl_version}, "
            f"tepo-verl was checked against verl {TESTED_VERL}. TEPO would not run as documented, so it is refused.")


def check_contract(source: VerlSource | None = None) -> None:
    """Raise VerlContractError (one line per broken assumption) unless the installed verl matches every one."""
    broken = broken_assumptions(source)
    if broken:
        verl_version = installed_verl_version()
        raise VerlContractError("\n".join(contract_line(a, p, verl_version) for a, p in broken))
