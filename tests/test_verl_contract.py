"""The verl contract (tepo_verl/verl_adapter/contract.py): the installed verl meets every assumption; changes that
keep what the adapter relies on (verl pull requests #7514 and #7415 among them) pass; each kind of change that breaks
it, planted into the installed verl's own source, fails in one line that names the assumption and the installed verl
version, in a verl command before Ray starts; TEPO_VERL_CONTRACT=warn turns those lines into warnings and `tepo`
runs. Changes to one module are planted into the running process (contract.VerlSource executes the changed text);
a change to a class other modules import (verl's Metric) and everything the plugin does at load run in a subprocess
on a copy of verl (tests/verl_copy.py). Also the search-path plugin's line when verl's plugins are off."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import fresh_python
import pytest
import verl  # noqa: F401  (loads the plugin first, as in every verl process)
from verl_copy import copy_of_verl, run_with_verl

from tepo_verl.verl_adapter import contract
from tepo_verl.verl_adapter.contract import (
    CONTRACT_VARIABLE,
    ENGINE_WORKERS,
    LEGACY_TRAINER,
    LOSSES,
    MAIN_PPO,
    METRIC,
    PY_FUNCTIONAL,
    TRAINER_BASE,
    VerlContractError,
    VerlSource,
    check_contract,
)
from tepo_verl.verl_adapter.contract_probe import PROBE_LOSS_MODE
from tepo_verl.verl_adapter.run_metrics import ENV_FLAG as COMPARE_METRICS

pytestmark = pytest.mark.verl_090  # also run on verl 0.9.0 (make test-090, docs/testing.md)

REPO = Path(__file__).resolve().parents[1]
CHANGES = Path(__file__).resolve().parent / "verl_changes"

# ------------------------------------------------------------------ changes a later verl (or a lab's fork) could make

# name: (assumption(s) it breaks, module, text in the installed verl, what the changed verl has instead; None removes
# the module). Planted into the running process.
PLANTS = {
    "changed ppo_loss signature": ("ppo_loss signature", LOSSES,
                                   "data: TensorDict, dp_group=None):\n    \"\"\"Computes ppo",
                                   "data: TensorDict, dp_group=None, tq=None):\n    \"\"\"Computes ppo"),
    "actor loss module removed": ("ppo_loss signature", LOSSES, None, None),
    "rebound loss": ("ppo_loss binding", ENGINE_WORKERS, "partial(ppo_loss, config=actor_config)",
                     "partial(build_loss('ppo'), config=actor_config)"),
    "renamed model output": ("model output", LOSSES, 'model_output.get("entropy", None)',
                             'model_output.get("entropies", None)'),
    "renamed field": ("selected fields", LOSSES, '["response_mask", "old_log_probs", "advantages"]',
                      '["response_mask", "old_log_prob", "advantages"]'),
    "fields swapped": ("selected fields", LOSSES, '    old_log_prob = data["old_log_probs"]\n',
                       '    old_log_prob = data["advantages"]\n'),
    "fields handed on unpadded": ("selected fields", LOSSES, "data = data.select(*fields).to_padded_tensor()",
                                  "data = data.select(*fields)"),
    "changed policy-loss signature": ("policy-loss call", LOSSES,
                                      "        old_log_prob=old_log_prob,\n        log_prob=log_prob,\n",
                                      "        old_log_prob,\n        log_prob,\n"),
    "one more loss argument": ("policy-loss call", LOSSES, "        rollout_is_weights=rollout_is_weights,\n    )",
                               "        rollout_is_weights=rollout_is_weights,\n"
                               "        rollout_log_probs=data.get(\"rollout_log_probs\", None),\n    )"),
    "global batch info cleared": ("global batch info", LOSSES, "    policy_loss_fn = get_policy_loss_fn(loss_mode)",
                                  "    config.global_batch_info.clear()\n"
                                  "    policy_loss_fn = get_policy_loss_fn(loss_mode)"),
    "global batch info moved": ("global batch info", LOSSES,
                                '    config.global_batch_info["global_batch_size"] = data["global_batch_size"]\n', ""),
    "metric tensors": ("metric format", LOSSES,
                       "Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN)",
                       "{k: Metric(AggregationType.MEAN, v.detach()) for k, v in pg_metrics.items()}"),
    "mini-batch metrics as floats": ("step metric reduction", PY_FUNCTIONAL,
                                     "val.init_list() if isinstance(val, Metric) else []", "[]"),
    "dropped entropy": ("old entropy", TRAINER_BASE, 'fields=data.select("old_log_probs", "entropy")',
                        'fields=data.select("old_log_probs")'),
    "v1 trainer removed": (("step metric reduction", "old entropy", "trainer hooks"), TRAINER_BASE, None, None),
    "hook signature": ("trainer hooks", TRAINER_BASE, "def step(self, metrics: dict, timing_raw: dict)",
                       "def step(self, metrics: dict, timing_raw: dict, batch=None)"),
    "legacy entropy renamed": ("legacy old entropy", LEGACY_TRAINER, '"entropys": entropy.float()',
                               '"entropies": entropy.float()'),
    "validation moved": ("driver validation", MAIN_PPO, "from verl.utils.config import validate_config\n",
                         "from verl.utils import config as config_utils\n"),
}

# name: (assumption it breaks, {module: [(old, new), ...]}, `git diff` patches). Planted into a copy of verl.
COPY_PLANTS = {
    # verl's Metric rewritten as an accumulator, as verl pull request #5600 does (its diff, applied as is)
    "Metric as an accumulator (verl #5600)": ("step metric reduction", {},
                                              (CHANGES / "pr5600_metric_accumulator.patch",)),
    "step metrics averaged": ("step metric reduction", {METRIC: [("metrics[key] = val.aggregate()",
                                                                  "metrics[key] = np.mean(val.values)")]}, ()),
}

# verl pull request #7514: the four global-batch keys set by an update_global_batch_info() helper before the loss
PR_7514 = [
    ("def ppo_loss(config: ActorConfig, model_output, data: TensorDict, dp_group=None):",
     'def update_global_batch_info(config: ActorConfig, data: TensorDict) -> dict:\n'
     '    """Refresh loss-normalization metadata from the current micro-batch."""\n'
     '    global_batch_info = {\n'
     '        "dp_size": data["dp_size"],\n'
     '        "batch_num_tokens": data["batch_num_tokens"],\n'
     '        "global_batch_size": data["global_batch_size"],\n'
     '        "loss_scale_factor": config.loss_scale_factor,\n'
     '    }\n'
     '    config.global_batch_info.clear()\n'
     '    config.global_batch_info.update(global_batch_info)\n'
     '    return global_batch_info\n\n\n'
     "def ppo_loss(config: ActorConfig, model_output, data: TensorDict, dp_group=None):"),
    ('    # global batch info for loss aggregation\n'
     '    config.global_batch_info["dp_size"] = data["dp_size"]\n'
     '    config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]\n'
     '    config.global_batch_info["global_batch_size"] = data["global_batch_size"]\n'
     '    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor\n',
     "    update_global_batch_info(config, data)\n"),
]
# verl pull request #7415: the old-log-prob pass reads and writes through a rollout-data backend, the batch held in
# a variable named `materialized` (its hunks of PPOTrainer._compute_old_log_prob)
PR_7415 = [
    ('            data = tq.kv_batch_get(\n'
     '                keys=batch.keys, partition_id=batch.partition_id, select_fields=["rollout_log_probs"]\n'
     '            )\n'
     '            data["old_log_probs"] = data.pop("rollout_log_probs")\n'
     '            tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=data)\n',
     '            with rollout_data_backend.materialized_batch(\n'
     '                keys=batch.keys, partition_id=batch.partition_id, select_fields=["rollout_log_probs"]\n'
     '            ) as data:\n'
     '                data["old_log_probs"] = data.pop("rollout_log_probs")\n'
     '                rollout_data_backend.batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=data)\n'),
    ('        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)\n\n'
     '        # 2. write old_log_probs and entropy back to TransferQueue\n'
     '        data["old_log_probs"] = response_from_nested(data.pop("log_probs"), data["response_mask"])\n'
     '        data["entropy"] = response_from_nested(data.pop("entropy"), data["response_mask"])\n'
     '        batch = tq.kv_batch_put(\n'
     '            keys=batch.keys, partition_id=batch.partition_id, fields=data.select("old_log_probs", "entropy")\n'
     '        )\n\n'
     '        data = DataProto(batch=data.to_padded_tensor())\n',
     '        with rollout_data_backend.materialized_batch(\n'
     '            keys=batch.keys, partition_id=batch.partition_id, select_fields=fields\n'
     '        ) as materialized:\n'
     '            # 2. write old_log_probs and entropy back to TransferQueue\n'
     '            materialized["old_log_probs"] = response_from_nested(\n'
     '                materialized.pop("log_probs"), materialized["response_mask"]\n'
     '            )\n'
     '            materialized["entropy"] = response_from_nested(\n'
     '                materialized.pop("entropy"), materialized["response_mask"]\n'
     '            )\n'
     '            batch = rollout_data_backend.batch_put(\n'
     '                keys=batch.keys,\n'
     '                partition_id=batch.partition_id,\n'
     '                fields=materialized.select("old_log_probs", "entropy"),\n'
     '            )\n\n'
     '            data = DataProto(batch=materialized.to_padded_tensor())\n'),
]

# name: {module: [(old, new), ...]} that keep everything the adapter relies on
HARMLESS = {
    "global-batch keys set by a helper (verl #7514)": {LOSSES: PR_7514},
    "old entropy stored through a new variable (verl #7415)": {TRAINER_BASE: PR_7415},
    "global batch info cleared before it is filled": {LOSSES: [("    # global batch info for loss aggregation\n",
                                                                "    config.global_batch_info.clear()\n")]},
    "one more field selected when present": {LOSSES: [
        ('    if "ref_log_prob" in data:\n',
         '    if "rollout_log_probs" in data:\n        fields.append("rollout_log_probs")\n'
         '    if "ref_log_prob" in data:\n')]},
    "the engine finds ppo_loss through the losses module": {ENGINE_WORKERS: [
        ("from verl.workers.utils.losses import ppo_loss\n", "from verl.workers.utils import losses\n"),
        ("partial(ppo_loss, config=actor_config)", "partial(losses.ppo_loss, config=actor_config)")]},
}


def changed_text(module: str, pairs: list[tuple[str, str]]) -> str:
    text = VerlSource().text(module)
    for old, new in pairs:
        assert text.count(old) == 1, f"the change no longer matches the installed verl's {module}: {old!r}"
        text = text.replace(old, new)
    return text


def planted_source(module: str, old: str | None, new: str | None) -> VerlSource:
    return VerlSource({module: None if old is None else changed_text(module, [(old, new)])})


def _names(names: str | tuple[str, ...]) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else names


def assert_one_line_each(message: str, names: tuple[str, ...]) -> None:
    lines = message.splitlines()
    assert len(lines) == len(names), message  # one line per broken assumption
    for name, line in zip(names, lines, strict=True):
        assert line.startswith(f"tepo-verl's verl contract is broken ({name}): ")
        assert f"installed verl {contract.installed_verl_version()}" in line
        assert f"checked against verl {contract.TESTED_VERL}" in line
        assert line.endswith(f"so it is refused ({CONTRACT_VARIABLE}=warn runs it anyway, on a patched verl you have "
                             "checked).")


# ------------------------------------------------------------------ in the running process

def test_the_installed_verl_meets_every_assumption():
    assert contract.broken_assumptions() == []
    check_contract()


def test_the_probe_loss_is_gone_after_the_check():
    from verl.trainer.ppo import core_algos

    check_contract()
    assert PROBE_LOSS_MODE not in core_algos.POLICY_LOSS_REGISTRY


def test_every_assumption_has_a_plant_that_breaks_it():
    planted = {name for names, *_ in [*PLANTS.values(), *COPY_PLANTS.values()] for name in _names(names)}
    assert planted == {a.name for a in contract.ASSUMPTIONS}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_changed_verl_fails_in_one_line_naming_the_assumption_and_the_version(plant):
    names, module, old, new = PLANTS[plant]
    with pytest.raises(VerlContractError) as info:
        check_contract(planted_source(module, old, new))
    assert_one_line_each(str(info.value), _names(names))


@pytest.mark.parametrize("change", sorted(HARMLESS))
def test_a_change_that_keeps_what_the_adapter_relies_on_passes(change):
    source = VerlSource({module: changed_text(module, pairs) for module, pairs in HARMLESS[change].items()})
    assert contract.broken_assumptions(source) == []


def test_the_contract_matches_the_adapters_own_signatures():
    """One source of truth: the contract's keyword lists are what the adapter's functions accept."""
    from tepo_verl.verl_adapter.actor_loss import tepo_aware_ppo_loss
    from tepo_verl.verl_adapter.registry import compute_policy_loss_tepo

    assert tuple(inspect.signature(tepo_aware_ppo_loss).parameters) == contract.PPO_LOSS_PARAMETERS
    assert set(inspect.signature(compute_policy_loss_tepo).parameters) == set(contract.POLICY_LOSS_KEYWORDS)
    from verl.trainer.ppo.v1 import trainer_base

    from tepo_verl.import_hooks import is_replaced, restore
    from tepo_verl.verl_adapter import run_metrics

    run_metrics.patch_trainer_module(trainer_base)  # the hooks the contract checks are the ones run_metrics installs
    try:
        assert [hook for hook in contract.TRAINER_HOOKS if is_replaced(trainer_base.PPOTrainer.__dict__[hook])] == list(
            contract.TRAINER_HOOKS)
    finally:
        for hook in contract.TRAINER_HOOKS:
            restore(trainer_base.PPOTrainer, hook)
        restore(trainer_base, "agg_loss")


# ------------------------------------------------------------------ TEPO_VERL_CONTRACT

def test_warn_prints_each_broken_assumption_in_one_line_naming_it_and_the_variable(monkeypatch, capsys):
    names, module, old, new = PLANTS["v1 trainer removed"]
    monkeypatch.setenv(CONTRACT_VARIABLE, "warn")
    check_contract(planted_source(module, old, new))  # returns: tepo is installed
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(names)
    for name, line in zip(names, lines, strict=True):
        assert line.startswith(f"[tepo-verl] WARNING: tepo-verl's verl contract is broken ({name}): ")
        assert line.endswith(f"{CONTRACT_VARIABLE}=warn: TEPO runs anyway, unchecked on this point.")


@pytest.mark.parametrize("value", ["", "enforce"])
def test_unset_or_enforce_refuses(monkeypatch, value):
    monkeypatch.setenv(CONTRACT_VARIABLE, value)
    with pytest.raises(VerlContractError):
        check_contract(planted_source(*PLANTS["dropped entropy"][1:]))


def test_an_unknown_value_is_refused_in_one_line_naming_it_and_the_valid_ones(monkeypatch):
    monkeypatch.setenv(CONTRACT_VARIABLE, "off")
    with pytest.raises(VerlContractError) as info:
        check_contract()  # the installed verl meets the contract: the value alone is refused
    assert str(info.value) == (f"{CONTRACT_VARIABLE}='off' is not valid; valid values: enforce, warn "
                               "(unset means enforce)")


# ------------------------------------------------------------------ in a subprocess, on a copy of verl

_CHECK = """
from tepo_verl.verl_adapter import contract
try:
    contract.check_contract()
except contract.VerlContractError as error:
    print(error)
else:
    print("ACCEPTED")
"""


@pytest.mark.parametrize("plant", sorted(COPY_PLANTS))
def test_a_changed_verl_class_fails_in_one_line(plant, tmp_path):
    name, replacements, patches = COPY_PLANTS[plant]
    root = copy_of_verl(tmp_path / "verl_copy", replacements, patches)
    result = run_with_verl(root, ["-c", _CHECK], env={"VERL_USE_EXTERNAL_PLUGINS": "none"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_one_line_each(result.stdout.strip(), (name,))


_TEPO_IN_A_VERL_PROCESS = """
import sys
import torch
import verl  # loads the plugin, which checks the contract
from verl.utils.config import validate_config
from verl.workers.utils import losses
from batches import random_batch
from engine_batch import mini_batch, micro_batches, model_output
from verl_config import actor_config, compose_config

config = compose_config(["+algorithm=tepo", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"])
try:  # the driver's check, where a refused tepo stops
    validate_config(config, use_reference_policy=False, use_critic=False)
except Exception as error:
    print(f"REFUSED {type(error).__name__}: {error}")
    sys.exit(3)
batch = random_batch(0, 4, 5, lengths=[3, 2, 4, 5])
(micro,) = micro_batches(mini_batch(batch, [2, 3, 1, 2]))
loss, metrics = losses.ppo_loss(actor_config(["+algorithm=tepo"]), model_output(batch.log_prob, batch.entropy, micro),
                                micro)
print(f"TEPO RAN finite={bool(torch.isfinite(loss))} metrics={'tepo/mask_frac' in metrics}")
"""


@pytest.mark.parametrize("mode", [None, "warn"])
def test_a_patched_verl_refuses_tepo_unless_the_variable_says_run_anyway(mode, tmp_path):
    """A fork that adds an optional parameter to PPOTrainer.step (the trainer-hooks assumption), in a run that asks
    for the comparison metrics, which hook it: refused in the driver by default; with TEPO_VERL_CONTRACT=warn the
    plugin prints the assumption and the variable and TEPO runs."""
    names, module, old, new = PLANTS["hook signature"]
    root = copy_of_verl(tmp_path / "verl_copy", {module: [(old, new)]})
    env = {COMPARE_METRICS: "1", **({CONTRACT_VARIABLE: mode} if mode else {})}
    result = run_with_verl(root, ["-c", _TEPO_IN_A_VERL_PROCESS], env=env, cwd=tmp_path)
    contract_lines = [line for line in result.stderr.splitlines() if "verl contract is broken" in line]
    if mode is None:
        assert result.returncode == 3, result.stderr[-3000:]
        refusal = result.stdout.strip().splitlines()[-1]
        assert refusal.startswith(f"REFUSED TepoUnavailable: tepo-verl's verl contract is broken ({names}): ")
        assert f"{CONTRACT_VARIABLE}=warn runs it anyway" in refusal
    else:
        assert result.returncode == 0, result.stderr[-3000:]
        assert len(contract_lines) == 1  # the plugin's load, once
        assert contract_lines[0].startswith(f"[tepo-verl] WARNING: tepo-verl's verl contract is broken ({names}): ")
        assert f"{CONTRACT_VARIABLE}=warn" in contract_lines[0]
        assert result.stdout.strip().splitlines()[-1] == "TEPO RAN finite=True metrics=True"


def test_the_trainer_hooks_are_checked_only_in_a_run_that_asks_for_the_comparison_metrics(tmp_path):
    """The same fork in a run without TEPO_VERL_COMPARE_METRICS=1: nothing hooks PPOTrainer.step, so nothing is
    broken, and TEPO runs without a warning."""
    _, module, old, new = PLANTS["hook signature"]
    root = copy_of_verl(tmp_path / "verl_copy", {module: [(old, new)]})
    result = run_with_verl(root, ["-c", _TEPO_IN_A_VERL_PROCESS], env={COMPARE_METRICS: "0"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "verl contract is broken" not in result.stderr
    assert result.stdout.strip().splitlines()[-1] == "TEPO RAN finite=True metrics=True"


@pytest.mark.parametrize("algorithm", ["tepo", "tepo_nomask"])
def test_a_broken_contract_refuses_tepo_in_the_driver_in_one_line(algorithm, tmp_path):
    name, module, old, new = PLANTS["renamed field"]
    root = copy_of_verl(tmp_path / "verl_copy", {module: [(old, new)]})
    result = run_with_verl(root, ["-m", "verl.trainer.main_ppo", f"algorithm={algorithm}"], cwd=tmp_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if f"verl contract is broken ({name})" in line]
    # loud at load (the plugin's report), then the driver's refusal from validate_config: the same line
    assert lines and lines[-1].startswith("tepo_verl.verl_adapter.plugin.TepoUnavailable: tepo-verl's verl contract")
    assert "(so 'tepo' cannot run)" in lines[-1]
    assert "Could not override" not in result.stderr  # the `algorithm=` rewrite still ran
    assert "ray init kwargs" not in result.stdout  # refused before Ray starts


# ------------------------------------------------------------------ verl's plugins off

def test_verl_plugins_off_says_so_instead_of_hydras_hint(tmp_path):
    """With verl's plugins off only Hydra's own plugin scan can still see tepo-verl (its search-path plugin). The scan
    finds `hydra_plugins/` on sys.path, as a regular install puts it in site-packages; an editable install (`pip
    install -e`) hides it from the scan, so there Hydra's hint stays. The repository on PYTHONPATH stands in for a
    regular install."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = fresh_python.run(["-m", "verl.trainer.main_ppo", "algorithm=tepo"], env=env, cwd=tmp_path)
    assert result.returncode != 0
    assert "Could not override" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        "error: algorithm=tepo is a tepo-verl preset, but tepo-verl's verl plugin did not load in this process: "
        "VERL_USE_EXTERNAL_PLUGINS=none turns verl's plugins off. Unset VERL_USE_EXTERNAL_PLUGINS or add tepo to it "
        "(VERL_USE_EXTERNAL_PLUGINS=tepo).")


def test_verl_plugins_listed_without_tepo_and_a_plain_verl_command_unaffected():
    from hydra_plugins.tepo_verl_searchpath import plugin_not_loaded_message

    assert "VERL_USE_EXTERNAL_PLUGINS=other does not list it" in plugin_not_loaded_message(
        ["+algorithm=gspo"], "other")
    assert plugin_not_loaded_message(["algorithm.adv_estimator=grpo"], "none") is None  # no preset selected
