"""The verl contract (tepo_verl/verl_adapter/contract.py): the installed verl meets every assumption, and each kind of
change a later verl could make (planted into the installed verl's own source text) fails in one line that names the
assumption and the installed verl version; in a verl command, before Ray starts. Also the search-path plugin's line
when verl's plugins are off."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import verl  # noqa: F401  (loads the plugin first, as in every verl process)

from tepo_verl.verl_adapter import contract
from tepo_verl.verl_adapter.contract import (
    ENGINE_WORKERS,
    LOSSES,
    MAIN_PPO,
    METRIC,
    PY_FUNCTIONAL,
    TRAINER_BASE,
    VerlContractError,
    VerlSource,
    check_contract,
)

REPO = Path(__file__).resolve().parents[1]

# (assumption(s) it breaks, module, text in the installed verl, what a changed verl has instead; None removes the
# module)
PLANTS = {
    "changed signature": ("ppo_loss signature", LOSSES, "data: TensorDict, dp_group=None):\n    \"\"\"Computes ppo",
                          "data: TensorDict, dp_group=None, tq=None):\n    \"\"\"Computes ppo"),
    "rebound loss": ("ppo_loss binding", ENGINE_WORKERS, "partial(ppo_loss, config=actor_config)",
                     "partial(build_loss('ppo'), config=actor_config)"),
    "renamed model output": ("model output", LOSSES, 'model_output.get("entropy", None)',
                             'model_output.get("entropies", None)'),
    "renamed field": ("selected fields", LOSSES, '["response_mask", "old_log_probs", "advantages"]',
                      '["response_mask", "old_log_prob", "advantages"]'),
    "one more selected field": ("selected fields", LOSSES, '    if "ref_log_prob" in data:\n',
                                '    if "rollout_log_probs" in data:\n        fields.append("rollout_log_probs")\n'
                                '    if "ref_log_prob" in data:\n'),
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
    "step metrics averaged": ("step metric reduction", METRIC, "metrics[key] = val.aggregate()",
                              "metrics[key] = np.mean(val.values)"),
    "old entropy dropped": ("old entropy", TRAINER_BASE, 'fields=data.select("old_log_probs", "entropy")',
                            'fields=data.select("old_log_probs")'),
    "v1 trainer removed": (("step metric reduction", "old entropy", "trainer hooks"), TRAINER_BASE, None, None),
    "hook signature": ("trainer hooks", TRAINER_BASE, "def step(self, metrics: dict, timing_raw: dict)",
                       "def step(self, metrics: dict, timing_raw: dict, batch=None)"),
    "validation moved": ("driver validation", MAIN_PPO, "from verl.utils.config import validate_config\n",
                         "from verl.utils import config as config_utils\n"),
}


def planted_source(module: str, old: str | None, new: str | None) -> VerlSource:
    if old is None:
        return VerlSource({module: None})
    text = VerlSource().text(module)
    assert text.count(old) == 1, f"the plant no longer matches the installed verl's {module}: {old!r}"
    return VerlSource({module: text.replace(old, new)})


def _names(names: str | tuple[str, ...]) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else names


def test_the_installed_verl_meets_every_assumption():
    assert contract.broken_assumptions() == []
    check_contract()


def test_every_assumption_has_a_plant_that_breaks_it():
    assert {name for names, *_ in PLANTS.values() for name in _names(names)} == {a.name for a in contract.ASSUMPTIONS}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_changed_verl_fails_in_one_line_naming_the_assumption_and_the_version(plant):
    names, module, old, new = PLANTS[plant]
    with pytest.raises(VerlContractError) as info:
        check_contract(planted_source(module, old, new))
    lines = str(info.value).splitlines()
    assert len(lines) == len(_names(names))  # one line per broken assumption
    for name, line in zip(_names(names), lines, strict=True):
        assert line.startswith(f"tepo-verl's verl contract is broken ({name}): ")
        assert f"installed verl {contract.installed_verl_version()}" in line
        assert f"checked against verl {contract.TESTED_VERL}" in line


def test_a_harmless_change_is_no_alarm():
    """Clearing the global batch info at the start of ppo_loss (it is refilled before the loss) breaks nothing."""
    text = VerlSource().text(LOSSES)
    old = "    # global batch info for loss aggregation\n"
    assert text.count(old) == 1
    assert contract.broken_assumptions(VerlSource({LOSSES: text.replace(old, "    config.global_batch_info.clear()\n")
                                                   })) == []


def test_the_contract_matches_the_adapters_own_signatures():
    """One source of truth: the contract's keyword lists are what the adapter's functions accept."""
    from tepo_verl.verl_adapter.actor_loss import tepo_aware_ppo_loss
    from tepo_verl.verl_adapter.registry import compute_policy_loss_tepo

    assert tuple(inspect.signature(tepo_aware_ppo_loss).parameters) == contract.PPO_LOSS_PARAMETERS
    assert set(inspect.signature(compute_policy_loss_tepo).parameters) == set(contract.POLICY_LOSS_KEYWORDS)
    from tepo_verl.verl_adapter import run_metrics  # noqa: F401  (its hooks' names are the contract's)

    source = inspect.getsource(run_metrics.patch_trainer_module)
    assert all(f"trainer.{hook} = {hook}" in source for hook in contract.TRAINER_HOOKS)


# ------------------------------------------------------------------ in a verl command, before Ray starts

_PLANTED_COMMAND = textwrap.dedent("""
    import runpy, sys
    from tepo_verl.verl_adapter import contract
    real_text = contract.VerlSource.text
    def text(self, module):
        source = real_text(self, module)
        return source.replace({old!r}, {new!r}) if module == {module!r} else source
    contract.VerlSource.text = text
    verl_dir = contract.VerlSource.path("verl.trainer").parent  # found, not imported
    sys.argv = [str(verl_dir / "main_ppo.py"), *{args!r}]  # as `python -m verl.trainer.main_ppo ARGS` has it
    runpy.run_module("verl.trainer.main_ppo", run_name="__main__")  # `import verl` loads the plugin: the contract
""")


@pytest.mark.parametrize("algorithm", ["tepo", "tepo_nomask"])
def test_a_broken_contract_refuses_tepo_in_the_driver_in_one_line(algorithm, tmp_path):
    name, module, old, new = PLANTS["renamed field"]
    code = _PLANTED_COMMAND.format(old=old, new=new, module=module, args=[f"algorithm={algorithm}"])
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                            cwd=tmp_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if f"verl contract is broken ({name})" in line]
    # loud at load (the plugin's report), then the driver's refusal from validate_config: the same line
    assert lines and lines[-1].startswith("tepo_verl.verl_adapter.plugin.TepoUnavailable: tepo-verl's verl contract")
    assert "(so 'tepo' cannot run)" in lines[-1]
    assert "Could not override" not in result.stderr  # the `algorithm=` rewrite still ran
    assert "ray init kwargs" not in result.stdout  # refused before Ray starts


def test_verl_plugins_off_says_so_instead_of_hydras_hint(tmp_path):
    """With verl's plugins off only Hydra's own plugin scan can still see tepo-verl (its search-path plugin). The scan
    finds `hydra_plugins/` on sys.path, as a regular install puts it in site-packages; an editable install (`pip
    install -e`) hides it from the scan, so there Hydra's hint stays. The repository on PYTHONPATH stands in for a
    regular install."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "algorithm=tepo"], capture_output=True,
                            text=True, timeout=300, env=env, cwd=tmp_path)
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
