"""The rule for missing prerequisites, enforced: under CI=true no test may skip. conftest_data.skip_or_fail fails
there already; any other skip (a pytest.skip or pytest.importorskip that did not go through it) is turned into a
failure here, with its reason, so nothing is silently left untested in CI.

And the end-to-end runs' one Ray head per pytest run (tests/conftest_e2e.py): the `ray_head` fixture, and its stop
when the run ends.

And how `make test` and `make check` share the tests between two pytest-xdist workers (`--dist loadscope
--no-loadscope-reorder`): a test file's tests stay on one worker, so its module fixtures are built once, and the
end-to-end files' tests (test_e2e_*.py) go to one worker, first and in order, while the other worker runs the rest
beside them; while they do, that other worker and everything it starts keep to the upper half of the CPUs
(pytest_runtest_setup), so that the trainer runs keep the lower half.

And each distinct YAML text is parsed once per test process (tests/yaml_memo.py): the suite composes verl's config
some hundred times in each process.

And what collection imported (verl, torch, transformers, Hydra: most of a test process's million objects) is kept
out of the garbage collector's full passes until the process exits (pytest_collection_finish): it lives as long
anyway, and each full pass traversed all of it (about a tenth of the CPU of the tests that compose configs). A
pytest-xdist worker then ends once its exit handlers have run, without the interpreter's teardown of those objects
(pytest_unconfigure); a pytest run without workers ends as usual."""

from __future__ import annotations

import atexit
import gc
import os
import sys
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


def other_tests_cpus(available: set[int]) -> set[int]:
    """The CPUs the other worker keeps to while the end-to-end runs go on: the upper half (at least one)."""
    ordered = sorted(available)
    return set(ordered[len(ordered) // 2:])


_suite = {"e2e begun here": False, "decided": False}


def pytest_runtest_setup(item):
    """In the worker that does not run the end-to-end tests, from its first test on: it and every process it starts
    keep to the upper half of the CPUs (other_tests_cpus), so the trainer runs, which need about one core each (a
    GRPO run took 206 s beside a busy loop on the other core, 199 s alone), keep the lower half. Only under
    pytest-xdist, and only where the run has end-to-end tests (not under `make check`)."""
    if scope(item.nodeid) == "e2e":
        _suite["e2e begun here"] = True
        return
    if _suite["e2e begun here"] or _suite["decided"] or not hasattr(item.config, "workerinput"):
        return
    _suite["decided"] = True  # at this worker's first test, once: the session's items do not change
    if any(scope(other.nodeid) == "e2e" for other in item.session.items):
        cpus = other_tests_cpus(os.sched_getaffinity(0))
        for thread in os.listdir("/proc/self/task"):  # the affinity is a thread's: set it for each one
            os.sched_setaffinity(int(thread), cpus)


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


def pytest_collection_finish(session):
    gc.freeze()  # what is alive now is alive until the end: full collections need not traverse it
    atexit.register(gc.unfreeze)  # at exit: the interpreter's shutdown (where it has one) frees it as usual


def pytest_unconfigure(config):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: every result is with the controller now
        atexit.register(_exit_once_the_exit_handlers_ran)


def _exit_once_the_exit_handlers_ran():
    """A worker's last step: the exit handlers (logging's flush, the pools' and servers' stops, the temporary
    folders' removal), then the end of the process, without the interpreter's teardown of the million objects the
    worker imported (two full garbage collections over them, 2-3 s at the end of each run). Registered last, so it
    runs first; it runs the others itself."""
    atexit.unregister(_exit_once_the_exit_handlers_ran)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def pytest_sessionfinish(session, exitstatus):
    conftest_e2e.stop_shared_ray_head()
