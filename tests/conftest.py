"""The rule for missing prerequisites, enforced: under CI=true no test may skip. conftest_data.skip_or_fail fails
there already; any other skip (a pytest.skip or pytest.importorskip that did not go through it) is turned into a
failure here, with its reason, so nothing is silently left untested in CI.

And the end-to-end runs' one Ray head per pytest run (tests/conftest_e2e.py): the `ray_head` fixture, and its stop
when the run ends."""

from __future__ import annotations

import os

import conftest_e2e
import pytest
from conftest_data import in_ci

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


def pytest_sessionfinish(session, exitstatus):
    conftest_e2e.stop_shared_ray_head()
