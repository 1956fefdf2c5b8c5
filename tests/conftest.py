"""The rule for missing prerequisites, enforced: under CI=true no test may skip. conftest_data.skip_or_fail fails
there already; any other skip (a pytest.skip or pytest.importorskip that did not go through it) is turned into a
failure here, with its reason, so nothing is silently left untested in CI.

And the end-to-end runs' one Ray head per pytest run (tests/conftest_e2e.py): the `ray_head` fixture, and its stop
when the run ends.

And how `make test` and `make check` share the tests between two pytest-xdist workers (`--dist loadscope
--no-loadscope-reorder`): a test file's tests stay on one worker, so its module fixtures are built once, and the
end-to-end files' tests (test_e2e_*.py) go to one worker, first and in order, while the other worker runs the rest
beside them.

And each distinct YAML text is parsed once per test process (tests/yaml_memo.py): the suite composes verl's config
some hundred times in each process."""

from __future__ import annotations

import os
from pathlib import Path

import conftest_e2e
import pytest
import yaml_memo
from conftest_data import in_ci

yaml_memo.install()

#: The wheel check (tests/test_wheel.py: a fresh venv with verl from the package index, about 10 minutes on 2 cores)
#: runs where it is asked for: TEPO_VERL_WHEEL_CHECK=1, or its file named; `make check-wheel` runs it without pytest.
collect_ignore = [] if os.environ.get("TEPO_VERL_WHEEL_CHECK") == "1" else ["test_wheel.py"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true, and the test skipped ({reason}): in CI a missing prerequisite is a failure"


@pytest.fixture(scope="session")
def ray_head() -> conftest_e2e.RayHead:
    """The Ray head every end-to-end run of this pytest run connects to (conftest_e2e.shared_ray_head)."""
    return conftest_e2e.shared_ray_head()


def scope(nodeid: str) -> str:
    """A test's share of the work under `make test`: its file, or "e2e" for every end-to-end file (test_e2e_*.py)."""
    path = nodeid.split("::")[0]
    return "e2e" if Path(path).name.startswith("test_e2e_") else path


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: scope(item.nodeid) != "e2e")  # stable: the end-to-end runs first, in file order


@pytest.hookimpl(optionalhook=True)  # pytest without pytest-xdist runs the suite on one process
def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadscope`, pytest-xdist's scheduler with the scopes above (the controller sees node ids only,
    not markers; pytest-xdist's own loadgroup cannot rename node ids on pytest 9.2)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return SuiteScopes(config, log)


def pytest_sessionfinish(session, exitstatus):
    conftest_e2e.stop_shared_ray_head()
