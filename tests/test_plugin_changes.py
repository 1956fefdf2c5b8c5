"""Every change the plugin makes to verl at run time is a row of docs/plugin.md's table, and nothing else changes.

The table ("What the plugin changes in verl at run time") is read from the page: each row's targets (the code spans
of its first column that name something in verl or the process) and its conditions (its `when` column). Fresh
processes (tests/plugin_changes_probe.py) play a verl command selecting `grpo`, one selecting `tepo` (on the v1
trainer, then on the legacy trainer), a run asking for the comparison metrics (before and after the trainer module
is imported) and a failed load; each fingerprints every attribute of every imported verl module and class, verl's
registries, Hydra's plugin registry, `sys.argv`, `sys.meta_path` and `os.environ`, and one more process does the
same without the plugin. What differs must be exactly the targets of the rows whose condition holds.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fresh_python
import pytest
from omegaconf import OmegaConf
from plugin_changes_probe import SCENARIOS
from verl_config import compose_config

REPO = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).resolve().parent / "plugin_changes_probe.py"
TABLE_HEADING = "## What the plugin changes in verl at run time"

#: What each moment the probe fingerprints is, in the table's conditions.
MOMENT_CONDITIONS = {
    "grpo": {"loaded", "verl command"},
    "tepo": {"loaded", "verl command", "tepo loss"},
    "tepo on the legacy trainer": {"loaded", "verl command", "tepo loss", "tepo on the legacy trainer"},
    "compare, trainer not imported": {"loaded", "verl command", "compare metrics, trainer not imported"},
    "compare, trainer imported": {"loaded", "verl command", "compare metrics, trainer imported"},
    "failed load": {"failed load", "verl command"},
}
#: The modules a trainer process imports, so that every one the plugin may touch is compared.
TRAINER_MODULES = [
    "verl.trainer.main_ppo", "verl.trainer.main_ppo_v0", "verl.trainer.ppo.ray_trainer",
    "verl.trainer.ppo.v1.trainer_base", "verl.workers.engine_workers", "verl.trainer.distillation.losses",
]
#: The configs the scenarios validate and run the loss with; VALID completes what verl's validate_config requires.
CONFIGS = {"grpo": ["+algorithm=grpo"], "tepo": ["+algorithm=tepo"],
           "tepo_legacy": ["+algorithm=tepo", "trainer.use_v1=False"]}
VALID = ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2"]
#: Environment variables the test itself sets for a scenario (inputs, not changes).
TEST_INPUTS = {"os.environ['TEPO_VERL_COMPARE_METRICS']"}
_TARGET = re.compile(r"^(?:(?:verl|hydra)\.[\w.]+(?:\['\w+'\])?|sys\.(?:argv|meta_path)|os\.environ\['\w+'\])$")


def change_table(text: str) -> list[tuple[set[str], set[str]]]:
    """(targets, conditions) per row of the table under TABLE_HEADING."""
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header == ["change", "when", "why", "needed by", "without it"], header
    table = []
    for line in rows[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == len(header), line
        targets = {span for span in re.findall(r"`([^`]+)`", cells[0]) if _TARGET.match(span)}
        conditions = set(re.findall(r"`([^`]+)`", cells[1]))
        assert targets and conditions, line
        table.append((targets, conditions))
    return table


def documented_conditions(text: str) -> set[str]:
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    return {match for line in section.splitlines() if line.startswith("- `")
            for match in re.findall(r"`([^`]+)`", line.split(":", 1)[0])}


def _probe(scenario: str, spec: Path, out: Path, env: dict[str, str]) -> dict:
    result = fresh_python.run([str(PROBE), scenario, str(spec), str(out)], timeout=900, env=env, cwd=REPO)
    assert result.returncode == 0, (scenario, result.stderr[-4000:])
    return json.loads(out.read_text())


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEPO_VERL_", "VERL_USE_EXTERNAL_PLUGINS"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**env, **extra}


@pytest.fixture(scope="module")
def moments(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plugin-changes")
    configs = {name: OmegaConf.to_yaml(compose_config([*VALID, *overrides])) for name, overrides in CONFIGS.items()}
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"modules": {"trainer": TRAINER_MODULES}, "configs": configs}))
    jobs = {name: _environment(**({"TEPO_VERL_COMPARE_METRICS": "1"} if name == "compare" else {}))
            for name in SCENARIOS}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(lambda name: _probe(name, spec, tmp / f"{name}.json", jobs[name]), jobs)
        found = {moment: values for result in results for moment, values in result.items()}
    imported = {moment: found[moment]["verl modules"][1].split() for moment in MOMENT_CONDITIONS}
    # the process without the plugin imports what they imported, at the same two points
    spec.write_text(json.dumps({"configs": configs, "modules": {
        "early": imported["compare, trainer not imported"], "trainer": sorted(set().union(*imported.values()))}}))
    found.update(_probe("pristine", spec, tmp / "pristine.json", _environment(VERL_USE_EXTERNAL_PLUGINS="none")))
    return found


def owner(name: str, modules: set[str]) -> str | None:
    """The verl module among `modules` that a fingerprinted name lives in (None for the process's own names)."""
    parts = name.split("[", 1)[0].split(".")
    return next((".".join(parts[:n]) for n in range(len(parts) - 1, 0, -1) if ".".join(parts[:n]) in modules), None)


def changed(moment: dict, baseline: dict) -> set[str]:
    """Names whose description differs from the process without the plugin at the same point, among the modules both
    imported. A package's attribute naming a submodule is the import system's, not a change."""
    both = set(moment["verl modules"][1].split()) & set(baseline["verl modules"][1].split())
    names = {name for name, (module, _) in (moment | baseline).items() if not module or module in both}
    names -= {"verl modules"} | TEST_INPUTS
    described = {name: (moment.get(name, [None, None])[1], baseline.get(name, [None, None])[1]) for name in names}
    return {name for name, (now, before) in described.items()
            if now != before and not any(str(d).startswith("module ") for d in (now, before))}


def expected(table, holds: set[str], moment: dict, every_module: set[str]) -> set[str]:
    """The targets of the rows whose condition holds, where the module they live in is imported."""
    modules = set(moment["verl modules"][1].split())
    targets = set().union(*(targets for targets, conditions in table if conditions & holds))
    return {t for t in targets if not t.startswith("verl.") or owner(t, every_module) in modules}


BASELINE = {"compare, trainer not imported": "pristine, early"}


def test_the_table_lists_exactly_what_loading_the_plugin_changes(moments):
    text = (REPO / "docs" / "plugin.md").read_text()
    table = change_table(text)
    assert documented_conditions(text) == set().union(*MOMENT_CONDITIONS.values())
    assert {c for _, conditions in table for c in conditions} <= documented_conditions(text)
    every_module = set(moments["pristine"]["verl modules"][1].split())
    for moment, holds in MOMENT_CONDITIONS.items():
        baseline = moments[BASELINE.get(moment, "pristine")]
        assert changed(moments[moment], baseline) == expected(table, holds, moments[moment], every_module), moment


def test_a_grpo_process_keeps_verls_own_functions_but_the_loss_adapter_and_the_checks(moments):
    """The table's promise for a process that does not select `tepo`, spelled out: beyond registering the loss,
    the estimator and the presets, only the rows the page justifies (the loss adapter in every process, the checks,
    the `algorithm=` rewrite)."""
    grpo = changed(moments["grpo"], moments["pristine"])
    assert grpo == {
        "verl.workers.utils.losses.ppo_loss", "verl.workers.engine_workers.ppo_loss",
        "verl.trainer.distillation.losses.ppo_loss", "verl.trainer.distillation.ppo_loss",
        "verl.utils.config.validate_config", "verl.trainer.main_ppo.validate_config",
        "verl.trainer.main_ppo_v0.validate_config",
        "verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY['tepo']",
        "verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY['tepo']", "hydra.core.plugins.Plugins", "sys.argv"}
    assert moments["grpo"]["sys.argv"][1] == repr("+algorithm=grpo")
    assert [name for name in moments if name.startswith("errors")] == ["errors failed"]


def test_a_failed_load_refuses_tepo_in_validate_config(moments):
    assert moments["errors failed"]["tepo"][1].startswith("TepoUnavailable: tepo-verl supports verl")
    assert moments["failed load"]["verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY['tepo']"][1].startswith(
        "function tepo_verl.verl_adapter.plugin._register_failure_stubs.<locals>.failed")
