"""Hydra search-path plugin: adds tepo-verl's config groups (the `algorithm/` presets) to every Hydra app.

Hydra finds this plugin by scanning the `hydra_plugins` namespace, even when verl's plugin loading is off
(`VERL_USE_EXTERNAL_PLUGINS=none`) and tepo-verl's verl plugin never ran. Then `algorithm=tepo` would end in Hydra's
"Could not override 'algorithm'" hint, and `+algorithm=tepo` would compose a loss that no process registers (and,
for the baselines, a run without tepo-verl's comparison metrics). In a verl command that selects one of the presets,
this plugin says so instead, in one line, and exits. verl 0.8 and older never load verl plugins at all: there the
line names the installed verl and the supported range.
"""

import os
import sys
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


def _presets() -> set[str]:
    import importlib.util

    spec = importlib.util.find_spec("tepo_verl")
    if spec is None or not spec.submodule_search_locations:
        return set()
    return {p.stem for p in (Path(list(spec.submodule_search_locations)[0]) / "config" / "algorithm").glob("*.yaml")}


def _is_verl_command() -> bool:
    """`python -m verl....`, or a script inside the installed verl package (verl is imported by then)."""
    main, verl = sys.modules.get("__main__"), sys.modules.get("verl")
    if (getattr(getattr(main, "__spec__", None), "name", None) or "").startswith("verl."):
        return True
    main_file, verl_file = getattr(main, "__file__", None), getattr(verl, "__file__", None)
    return bool(main_file and verl_file) and Path(verl_file).resolve().parent in Path(main_file).resolve().parents


def selected_preset(argv: list[str]) -> str | None:
    """The tepo-verl preset an `algorithm=NAME` / `+algorithm=NAME` override selects, if any."""
    presets = _presets()
    for arg in argv:
        name = arg.lstrip("+").partition("algorithm=")[2] if arg.lstrip("+").startswith("algorithm=") else None
        if name in presets:
            return name
    return None


def plugin_not_loaded_message(argv: list[str], policy: str, verl_version: str | None = None) -> str | None:
    """Why a verl command that selects a preset cannot work without tepo-verl's verl plugin, or None.

    `verl_version`: the installed verl (None: not known); one outside the supported range is the reason given.
    """
    preset = selected_preset(argv)
    if preset is None:
        return None
    from packaging.version import Version

    from tepo_verl.verl_adapter.version_check import SUPPORTED_VERL, unsupported_message

    if verl_version is not None and Version(verl_version) not in SUPPORTED_VERL:
        return f"algorithm={preset} is a tepo-verl preset, but {unsupported_message(verl_version)}"
    policy = policy.strip().lower()
    if policy == "none":
        why = "VERL_USE_EXTERNAL_PLUGINS=none turns verl's plugins off"
    elif policy not in ("", "auto") and "tepo" not in {p.strip() for p in policy.split(",")}:
        why = f"VERL_USE_EXTERNAL_PLUGINS={policy} does not list it"
    else:
        why = "its `verl.plugins` entry point is not installed in this environment (pip install -e .)"
    return (f"algorithm={preset} is a tepo-verl preset, but tepo-verl's verl plugin did not load in this process: "
            f"{why}. Unset VERL_USE_EXTERNAL_PLUGINS or add tepo to it (VERL_USE_EXTERNAL_PLUGINS=tepo).")


class TepoVerlSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # Idempotent: Hydra's plugin scan and the plugin's direct registration may both run it.
        if not any(element.provider == "tepo-verl" for element in search_path.get_path()):
            search_path.append(provider="tepo-verl", path="pkg://tepo_verl.config")
        plugin = sys.modules.get("tepo_verl.verl_adapter.plugin")
        loaded = plugin is not None and getattr(plugin, "_LOADED", False)  # a failed load refuses `tepo` itself
        if not loaded and _is_verl_command():
            from tepo_verl.verl_adapter.version_check import installed_verl

            message = plugin_not_loaded_message(sys.argv[1:], os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto"),
                                                installed_verl())
            if message:
                sys.exit(f"error: {message}")  # before Hydra composes anything; a traceback would add nothing
