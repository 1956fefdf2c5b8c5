"""Run as a script by tests/test_plugin_changes.py: one fresh process that fingerprints verl and the process.

    python plugin_changes_probe.py SCENARIO INPUT.json OUTPUT.json

INPUT holds the composed verl configs (YAML, composed by the test: composing here would start Hydra's plugin
registry, one of the things fingerprinted) and the verl modules to import. SCENARIO is `pristine` (the plugin never
loads: the test sets VERL_USE_EXTERNAL_PLUGINS=none) or one of SCENARIOS: a verl command's driver
(`sys.argv` as `python -m verl.trainer.main_ppo algorithm=NAME` has it) that imports verl (which loads the plugin),
imports the modules a trainer imports, and does what such a process does: validates its config with verl's
`validate_config`, runs the actor loss on a micro-batch. OUTPUT gets one fingerprint per named moment.

A fingerprint maps a name (`verl.workers.utils.losses.ppo_loss`, `verl.utils.metric.utils.Metric.aggregate_dp`,
`verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY['tepo']`, `sys.argv`, `sys.meta_path`, `os.environ['X']`,
`hydra.core.plugins.Plugins`) to a description that is equal in two processes exactly when the thing is the same:
a function by its qualified name and where its code is defined, a class by its name, a value by its repr or type.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from types import CodeType, ModuleType

HERE = Path(__file__).resolve().parent

#: What each process does, in order: ("argv", NAME) sets sys.argv and imports verl; ("import", LIST) imports the
#: modules of INPUT's LIST; ("validate", CONFIG) and ("loss", CONFIG) with one of INPUT's configs; ("snapshot",
#: MOMENT); ("fail_load", None), before `import verl`, makes the plugin fail to load (a version outside the supported
#: range). `pristine` does what the others do, with the plugin off: what a moment is compared with.
SCENARIOS = {
    "grpo": [("argv", "grpo"), ("import", "trainer"), ("validate", "grpo"), ("loss", "grpo"), ("snapshot", "grpo")],
    "tepo": [("argv", "tepo"), ("import", "trainer"), ("validate", "tepo"), ("loss", "tepo"), ("snapshot", "tepo"),
             ("validate", "tepo_legacy"), ("snapshot", "tepo on the legacy trainer")],
    "compare": [("argv", "grpo"), ("snapshot", "compare, trainer not imported"), ("import", "trainer"),
                ("validate", "grpo"), ("loss", "grpo"), ("snapshot", "compare, trainer imported")],
    "failed": [("fail_load", None), ("argv", "tepo"), ("import", "trainer"), ("validate", "tepo"), ("loss", "grpo"),
               ("snapshot", "failed load")],
}
PRISTINE = [("argv", "grpo"), ("import", "early"), ("snapshot", "pristine, early"), ("import", "trainer"),
            ("validate", "grpo"), ("loss", "grpo"), ("snapshot", "pristine")]


def describe(value) -> str:
    """Equal in two processes exactly when `value` is the same function, class or value."""
    if isinstance(value, classmethod | staticmethod):
        return f"{type(value).__name__} of {describe(value.__func__)}"
    if isinstance(value, functools.partial):
        return f"partial of {describe(value.func)}"
    code = getattr(value, "__code__", None) if not isinstance(value, type) else None
    if isinstance(code, CodeType):
        return (f"function {getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')} "
                f"at {code.co_filename}:{code.co_firstlineno}")
    if isinstance(value, type):
        return f"class {value.__module__}.{value.__qualname__}"
    if isinstance(value, ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, str | int | float | bool | bytes | type(None)):
        return repr(value)[:300]
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def _is_verl(name: str) -> bool:
    return name == "verl" or name.startswith("verl.")


def fingerprint() -> dict[str, list[str]]:
    """name -> [owner, description]; the owner is the verl module the name lives in ("" for the process's own)."""
    out: dict[str, list[str]] = {}
    seen_dicts: set[int] = set()
    classes: dict[str, type] = {}
    for module_name in sorted(n for n in list(sys.modules) if _is_verl(n)):
        module = sys.modules[module_name]
        if module is None:
            continue
        for attr, value in sorted(vars(module).items()):
            if module_name == "verl" and attr.startswith("_"):
                continue  # verl's plugin discovery state (_plugins_policy, _ep, ...): set differently on purpose
            key = f"{module_name}.{attr}"
            out[key] = [module_name, describe(value)]
            if isinstance(value, type) and _is_verl(value.__module__):
                classes.setdefault(f"{value.__module__}.{value.__qualname__}", value)
            if isinstance(value, dict) and id(value) not in seen_dicts and all(isinstance(k, str) for k in value):
                seen_dicts.add(id(value))  # a dict bound in several modules is named once, by its first binding
                for entry, item in value.items():
                    out[f"{key}[{entry!r}]"] = [module_name, describe(item)]
    for class_name, cls in classes.items():
        for attr, value in vars(cls).items():
            out[f"{class_name}.{attr}"] = [cls.__module__, describe(value)]
    meta_path = tuple(f"{type(f).__module__}.{type(f).__qualname__}" for f in sys.meta_path)
    out["sys.meta_path"] = ["", describe(" ".join(meta_path))]
    for name, value in os.environ.items():
        out[f"os.environ[{name!r}]"] = ["", value]
    plugins = sys.modules.get("hydra.core.plugins")
    instance = None if plugins is None else plugins.Singleton._instances.get(plugins.Plugins)
    out["hydra.core.plugins.Plugins"] = ["", describe(None if instance is None else
                                                      " ".join(sorted(instance.class_name_to_class)))]
    return out


def main_ppo_path() -> str:
    import importlib.util

    return str(Path(importlib.util.find_spec("verl").submodule_search_locations[0]) / "trainer" / "main_ppo.py")


def run_loss(config_yaml: str) -> None:
    """verl's actor loss (whatever verl.workers.utils.losses.ppo_loss is now) on one mini-batch, as the engine
    calls it: one call and one backward per micro-batch."""
    sys.path.insert(0, str(HERE))
    from batches import random_batch
    from engine_batch import micro_batches, mini_batch, model_output
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils import losses

    actor = omega_conf_to_dataclass(OmegaConf.create(config_yaml).actor_rollout_ref.actor)
    batch = random_batch(3, 4, 5)
    start = 0
    data = mini_batch(batch, [2, 3, 1, 2], ref_log_prob=batch.ref_log_prob, micro_batch_size=2)
    for micro in micro_batches(data):
        rows = list(range(start, start + len(micro)))
        start += len(micro)
        loss, _ = losses.ppo_loss(actor, model_output(batch.log_prob[rows], batch.entropy[rows], micro), micro)
        loss.backward()


def main(scenario: str, input_path: str, output_path: str) -> None:
    import importlib

    spec = json.loads(Path(input_path).read_text())
    moments: dict[str, dict[str, list[str]]] = {}
    argv_before = None
    for action, arg in PRISTINE if scenario == "pristine" else SCENARIOS[scenario]:
        if action == "fail_load":
            from packaging.specifiers import SpecifierSet

            import tepo_verl.verl_adapter.version_check as version_check

            version_check.SUPPORTED_VERL = SpecifierSet("<0.1")
        elif action == "argv":
            sys.argv = [main_ppo_path(), f"algorithm={arg}"]  # as `python -m verl.trainer.main_ppo` has it
            argv_before = list(sys.argv)
            import verl  # noqa: F401  (loads the plugin, as main_ppo's first import does; pristine: plugins off)

            os.environ.pop("VERL_USE_EXTERNAL_PLUGINS", None)  # pristine's switch, not a change to compare
        elif action == "import":
            for name in spec["modules"].get(arg, []):
                importlib.import_module(name)
        elif action == "validate":
            from omegaconf import OmegaConf
            from verl.utils import config as verl_config

            try:
                verl_config.validate_config(OmegaConf.create(spec["configs"][arg]), use_reference_policy=False,
                                            use_critic=False)
            except Exception as error:  # noqa: BLE001 - a failed load refuses tepo here, as it should
                moments.setdefault(f"errors {scenario}", {})[arg] = ["", f"{type(error).__name__}: {error}"]
        elif action == "loss":
            run_loss(spec["configs"][arg])
        elif action == "snapshot":
            moment = fingerprint()
            moment["sys.argv"] = ["", describe(" ".join(sys.argv[1:]) if sys.argv != argv_before else None)]
            moment["verl modules"] = ["", " ".join(sorted(n for n in sys.modules if _is_verl(n)))]
            moments[arg] = moment
    Path(output_path).write_text(json.dumps(moments))


if __name__ == "__main__":
    main(*sys.argv[1:])
