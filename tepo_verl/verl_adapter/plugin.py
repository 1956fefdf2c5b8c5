"""Entry point of the `verl.plugins` group: `import verl` calls `load()` in every verl process.

Before installing anything, `load()` checks the installed verl: its version (version_check.py) and every assumption
the adapter makes about its internals (contract.py). verl logs a failing plugin at debug level only, so `load()`
never lets a failure pass silently: it prints the error to stderr, registers `tepo` stubs that raise it the moment
`tepo` is selected in a worker, and, in the driver, refuses a config that selects `tepo` in verl's
`validate_config` (one line, before Ray starts).

Every change the plugin makes to verl at run time, when it applies and why, is the table in docs/plugin.md ("What
the plugin changes in verl"); tests/test_plugin_changes.py compares that table with what loading it changes.
"""

from __future__ import annotations

import sys
import traceback

from tepo_verl.import_hooks import replace

_LOADED = False
LOAD_ERROR: BaseException | None = None


def _install() -> None:
    from tepo_verl.verl_adapter import actor_loss, cli, registry, run_metrics  # noqa: F401  (registers `tepo`)
    from tepo_verl.verl_adapter.contract import check_contract
    from tepo_verl.verl_adapter.version_check import check_verl_version

    check_verl_version()
    check_contract(scopes=("load", "compare") if run_metrics.requested() else ("load",))
    run_metrics.install()  # compare's extra columns, only where the run asks for them (TEPO_VERL_COMPARE_METRICS=1)
    actor_loss.install()
    _wrap_validate_config(validate_for_tepo)
    _register_hydra_search_path()
    cli.rewrite_sys_argv()


def validate_for_tepo(config) -> None:
    """What verl's validate_config runs first: the TEPO checks, then what a config that selects `tepo` on the legacy
    trainer needs in this process (legacy_trainer.py; main_ppo_v0's TaskRunner validates before it builds that
    trainer)."""
    from tepo_verl.verl_adapter import checks, legacy_trainer
    from tepo_verl.verl_adapter.contract import check_contract

    checks.check_tepo_config(config)
    if legacy_trainer.uses_legacy_trainer_with_tepo(config):
        check_contract(scopes=("legacy",))
        legacy_trainer.install()


def _register_hydra_search_path() -> None:
    """Register the presets' search-path plugin with Hydra directly.

    Hydra also finds it by scanning the `hydra_plugins` namespace package, but that scan misses packages
    installed in setuptools' default (strict) editable mode, i.e. `pip install -e .`.
    """
    from hydra.core.plugins import Plugins

    from hydra_plugins.tepo_verl_searchpath import TepoVerlSearchPathPlugin

    Plugins.instance().register(TepoVerlSearchPathPlugin)


def _wrap_validate_config(check) -> None:
    """Run `check(config)` inside verl's driver-side `validate_config` (main_ppo binds it after this runs)."""
    from verl.utils import config as verl_config

    def validating(stock):
        def validate_config(config, *args, **kwargs):
            check(config)
            return stock(config, *args, **kwargs)

        validate_config.__doc__ = stock.__doc__
        return validate_config

    replace(verl_config, "validate_config", validating)


def selects_tepo(config) -> bool:
    """Whether a verl config uses TEPO's loss or advantage estimator (plain lookups: verl may be half broken)."""
    def get(dotted):
        node = config
        for key in dotted.split("."):
            node = node.get(key, None) if hasattr(node, "get") else None
        return node

    return "tepo" in (get("actor_rollout_ref.actor.policy_loss.loss_mode"), get("algorithm.adv_estimator"))


class TepoUnavailable(RuntimeError):
    pass


def _refuse_tepo_in_driver(error: BaseException) -> None:
    """After a failed load: compose `algorithm=tepo` as usual, then refuse it in validate_config in one line."""
    message = str(error) if isinstance(error, _known_failures()) else f"tepo-verl failed to load: {error!r}"

    def refuse(config):
        if selects_tepo(config):
            raise TepoUnavailable(f"{message} (so 'tepo' cannot run)")

    for step in (lambda: _wrap_validate_config(refuse), _register_hydra_search_path,
                 lambda: __import__("tepo_verl.verl_adapter.cli", fromlist=["cli"]).rewrite_sys_argv()):
        try:
            step()
        except Exception:  # noqa: BLE001 - verl or Hydra itself is broken; the stderr report is all we can do
            pass


def _known_failures() -> tuple[type[BaseException], ...]:
    """Load failures whose one-line message says everything; any other is printed with its traceback."""
    from tepo_verl.verl_adapter.contract import VerlContractError
    from tepo_verl.verl_adapter.run_metrics import InvalidFlag
    from tepo_verl.verl_adapter.version_check import UnsupportedVerlVersion

    return VerlContractError, UnsupportedVerlVersion, InvalidFlag


def _register_failure_stubs(error: BaseException) -> None:
    """Make selecting `tepo` raise the load error instead of verl's generic 'unknown' (or a silent fallback)."""
    try:
        from verl.trainer.ppo import core_algos
    except Exception:  # noqa: BLE001 - verl itself is broken; the stderr report is all we can do
        return

    def failed(*args, **kwargs):
        raise RuntimeError(f"tepo-verl failed to load, so 'tepo' cannot run: {error!r}") from error

    core_algos.POLICY_LOSS_REGISTRY["tepo"] = failed
    core_algos.ADV_ESTIMATOR_REGISTRY["tepo"] = failed


def load() -> None:
    global _LOADED, LOAD_ERROR
    if _LOADED:
        return
    _LOADED = True
    try:
        _install()
    except Exception as error:  # noqa: BLE001 - reported loudly below, and re-raised on use
        LOAD_ERROR = error
        known = isinstance(error, _known_failures())
        report = f"{type(error).__name__}: {error}\n" if known else "".join(traceback.format_exception(error))
        print("\n[tepo-verl] ERROR: the TEPO plugin failed to load; selecting 'tepo' will fail.\n" + report,
              file=sys.stderr, flush=True)
        _register_failure_stubs(error)
        _refuse_tepo_in_driver(error)
