"""The newcomer's two commands (Makefile), CI (.ci/run), the CPU recipe's dry run, and the rule that a missing
prerequisite skips a test only off CI: under CI=true it fails."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _pytest.outcomes import Failed, Skipped
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest as suite_conftest  # noqa: E402  (the suite's conftest.py, which pytest has imported as conftest)
import conftest_data  # noqa: E402
import conftest_e2e  # noqa: E402
import recipe_standin  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# ---- skip off CI, fail on CI -----------------------------------------------------------------------------------

@pytest.mark.parametrize("module", [conftest_e2e, conftest_data])
@pytest.mark.parametrize("ci, outcome", [("true", Failed), ("1", Failed), ("", Skipped), ("false", Skipped)])
def test_missing_prerequisite_fails_under_ci_and_skips_with_the_reason_elsewhere(module, ci, outcome, monkeypatch):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome) as info:
        module.skip_or_fail("the thing is missing")
    assert "the thing is missing" in str(info.value)


def test_missing_shared_folder_fails_under_ci(monkeypatch, tmp_path):
    monkeypatch.setattr(conftest_data, "MATH_EVAL_DIR", tmp_path / "shared" / "data" / "math_eval")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(Failed, match="offline maths evaluation sets are not at"):
        conftest_data.math_eval_dir()
    monkeypatch.delenv("CI")
    with pytest.raises(Skipped, match="CI=true fails instead"):
        conftest_data.math_eval_dir()


def test_mismatched_cpu_stack_fails_the_e2e_tests_under_ci(monkeypatch):
    conftest_data.require_module("vllm", "the check of the stack's versions runs only where vllm is installed")
    from tepo_lab.cpu import versions

    monkeypatch.setattr(versions, "mismatches",
                        lambda installed=None: ["verl: installed 0.8.0, required 0.9.0 or 0.9.1"])
    assert "verl: installed 0.8.0, required 0.9.0 or 0.9.1" in conftest_e2e.cpu_stack_problem()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(Failed, match="CI=true and the tested CPU stack is not installed"):
        conftest_e2e.require_cpu_stack()


def test_this_machine_has_what_ci_needs_when_ci_is_set():
    """Under CI=true nothing may be missing: the stack and ../shared are there."""
    if not conftest_e2e.in_ci():
        pytest.skip("checks CI's machine; set CI=true to run it (as .ci/run does)")  # never skips under CI
    assert conftest_e2e.cpu_stack_problem() is None
    assert (conftest_data.MATH_EVAL_DIR / "README.md").is_file()


def test_the_training_lock_is_held_across_nested_holders_and_released_after_the_last(tmp_path, monkeypatch):
    """conftest_e2e.training_lock flocks $TEPO_TRAIN_LOCK once however deeply it nests (the pytest run's Ray head
    holds it from its start while each training takes it again), and lets go when the last holder does."""
    import fcntl

    lock = tmp_path / "train.lock"
    monkeypatch.setenv("TEPO_TRAIN_LOCK", str(lock))

    def free() -> bool:  # what another process (a study) would get
        with open(lock, "a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(other, fcntl.LOCK_UN)
            return True

    with conftest_e2e.training_lock():
        with conftest_e2e.training_lock():
            assert not free()
        assert not free()
    assert free()


# ---- make demo / make test / .ci/run --------------------------------------------------------------------------

def _make_dry(target: str, venv: Path) -> list[str]:
    # Under `make test` the outer make's level, flags and command-line variables are in the environment.
    outer = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "VENV", "PYTHON3", "PYTEST_ARGS", "DEMO_ARGS")
    env = {k: v for k, v in os.environ.items() if k not in outer}
    proc = subprocess.run(["make", "--no-print-directory", "-n", target, f"VENV={venv}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


XDIST = "-n 2 --dist loadscope --no-loadscope-reorder"  # the scopes: tests/conftest.py


@pytest.mark.parametrize("target, runs", [("demo", "-m tepo_lab.demo"), ("test", f"-m pytest {XDIST} --durations=25"),
                                          ("check", f'-m pytest -m "not e2e" {XDIST}')])
def test_make_targets_set_up_a_fresh_venv_then_run(target, runs, tmp_path):
    venv = tmp_path / "venv"
    lines = _make_dry(target, venv)
    text = "\n".join(lines)
    assert f"python3 -m venv {venv}" in text  # created when missing
    order = [next(i for i, line in enumerate(lines) if needle in line) for needle in
             ("pip install --disable-pip-version-check --progress-bar off torch==2.13.0",
              "pip install --disable-pip-version-check --progress-bar off -e '.[test]' -e ./lab",
              "bash lab/tepo_lab/cpu/install_cpu.sh", "touch", runs)]
    assert order == sorted(order), lines  # torch, the plugin and its lab, the CPU stack, the stamp, then the job
    # the job runs as in an activated venv: recipes and tests that start `python` by name get this one
    assert lines[-1].startswith(f'PATH="{venv}/bin:$PATH" VIRTUAL_ENV="{venv}" {venv}/bin/python {runs}'), lines[-1]


def test_make_test_090_sets_up_its_own_pinned_venv_then_runs_the_marked_tests(tmp_path):
    venv = tmp_path / "venv-090"
    outer = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "VENV_090", "PYTHON3", "PYTEST_ARGS")
    proc = subprocess.run(["make", "--no-print-directory", "-n", "test-090", f"VENV_090={venv}"], cwd=REPO,
                          env={k: v for k, v in os.environ.items() if k not in outer}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    pinned = f"{venv}/bin/python -m pip install --disable-pip-version-check --progress-bar off " \
             "-c tools/verl-0.9.0-constraints.txt"
    order = [next(i for i, line in enumerate(lines) if needle in line) for needle in
             (f"python3 -m venv {venv}", f"{pinned} torch==2.13.0",
              f"{pinned} torch==2.13.0 verl==0.9.0 -e '.[test]' -e ./lab", f"touch {venv}/.tepo-verl-installed",
              "-m pytest -m verl_090")]
    assert order == sorted(order), lines  # venv, torch, verl 0.9.0 with the plugin and its lab, stamp, tests
    assert lines[-1].startswith(f'PATH="{venv}/bin:$PATH" VIRTUAL_ENV="{venv}" {venv}/bin/python -m pytest -m '
                                "verl_090"), lines[-1]


def test_second_make_skips_the_set_up(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    time.sleep(0.01)
    (venv / ".tepo-verl-installed").touch()  # newer than setup.py and the CPU installer
    os.utime(venv / ".tepo-verl-installed", (time.time() + 5, time.time() + 5))
    lines = _make_dry("test", venv)
    pytest = f'PATH="{venv}/bin:$PATH" VIRTUAL_ENV="{venv}" {venv}/bin/python -m pytest {XDIST} --durations=25 '
    assert lines == [f"{venv}/bin/ruff check --quiet .", pytest], lines  # ruff, then the tests (25 slowest shown)


#: A stand-in `make` for .ci/run: records where it ran, CI and its arguments, and exits with $FAKE_MAKE_EXIT.
FAKE_MAKE = """#!/usr/bin/env bash
echo "cwd=$PWD CI=${CI-unset} args=$*" >> "$FAKE_MAKE_LOG"
exit "${FAKE_MAKE_EXIT:-0}"
"""


@pytest.mark.parametrize("ci, expected", [(None, "true"), ("", "true"), ("1", "1")])
def test_ci_runs_make_test_from_the_repository_with_ci_set(ci, expected, tmp_path):
    """.ci/run, run from anywhere, runs `make test` then `make test-090` in the repository with CI set (a CI that sets
    CI keeps its value), so that a missing prerequisite fails instead of skipping; make's failure is CI's failure."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(FAKE_MAKE)
    (bin_dir / "make").chmod(0o755)
    log = tmp_path / "make.log"
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PATH": f"{bin_dir}:{os.environ['PATH']}",
                                                                "FAKE_MAKE_LOG": str(log)}
    if ci is not None:
        env["CI"] = ci
    proc = subprocess.run(["bash", str(REPO / ".ci" / "run")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().splitlines() == [f"cwd={REPO} CI={expected} args={target}"
                                            for target in ("test", "test-090")]
    failed = subprocess.run(["bash", str(REPO / ".ci" / "run")], cwd=tmp_path, env={**env, "FAKE_MAKE_EXIT": "3"},
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 3


# ---- recipes/cpu.sh DRY_RUN=1 and DRY_RUN=args ---------------------------------------------------------------------

def test_cpu_recipe_dry_run_prints_the_config_and_starts_nothing(tmp_path):
    """DRY_RUN=1 prints verl's `--cfg job` of what the recipe would run, and DRY_RUN=args the arguments it would give
    verl, whose composition is that config; neither starts anything."""
    conftest_data.require_module("verl", "composing verl's config needs verl")
    from verl_config import command_line_config

    run_dir = tmp_path / "runs" / "grpo-seed1"
    env = dict(os.environ, ALGO="grpo", STEPS="7", LR="3e-5", RUN_DIR=str(run_dir), PYTHON=sys.executable,
               TEPO_VERL_CACHE=str(tmp_path / "cache"))

    def dry_run(mode):
        return subprocess.run(["bash", str(REPO / "recipes" / "cpu.sh"), "trainer.test_freq=2"],
                              env={**env, "DRY_RUN": mode}, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    started = time.monotonic()
    proc = dry_run("1")
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = OmegaConf.create(proc.stdout)  # stdout is the composed config alone
    listed = dry_run("args")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert listed.stdout.splitlines()[-1] == "trainer.test_freq=2"
    assert OmegaConf.to_container(command_line_config(listed.stdout.splitlines())) == OmegaConf.to_container(config)
    assert config.algorithm.adv_estimator == "grpo"
    assert config.trainer.total_training_steps == 7
    assert config.trainer.test_freq == 2  # extra arguments go to verl last
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == 2
    assert config.actor_rollout_ref.actor.optim.lr == 3e-5
    assert config.data.train_files.startswith(str(tmp_path / "cache"))
    # the run asks for compare's columns in every Ray process (docs/compare.md), even on a cluster started beforehand
    assert config.ray_kwargs.ray_init.runtime_env.env_vars.TEPO_VERL_COMPARE_METRICS == "1"
    # nothing started: no run folder, no tiny build, no trainer
    assert not run_dir.exists() and not (tmp_path / "runs").exists()
    assert not (tmp_path / "cache").exists()
    assert "TaskRunner" not in proc.stdout + proc.stderr + listed.stdout + listed.stderr
    assert seconds < 120


@pytest.mark.parametrize(
    "env, message",
    [
        ({"ALGO": "ppo"}, "unknown ALGO='ppo'. Valid: cispo, clip_cov, dapo, dr_grpo, gmpo, grpo, gspo, kl_cov, sapo, "
                          "tepo, tepo_nomask"),
        ({"STEPS": "0"}, "STEPS must be a positive integer, got '0'"),
        ({"MINI": "3"}, "MINI dividing BATCH, got BATCH='4' MINI='3'"),
        ({"LR": "0"}, "LR must be a positive number (such as 1e-4 or 0.00003), got '0'"),
        ({"LR": "-1e-4"}, "LR must be a positive number (such as 1e-4 or 0.00003), got '-1e-4'"),
        ({"LR": "fast"}, "LR must be a positive number (such as 1e-4 or 0.00003), got 'fast'"),
        ({"DRY_RUN": "yes"}, "DRY_RUN must be 0, 1 or args, got 'yes'"),
    ],
)
def test_cpu_recipe_bad_settings(env, message, tmp_path):
    proc = subprocess.run(["bash", str(REPO / "recipes" / "cpu.sh")], env={**os.environ, "DRY_RUN": "1", **env},
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


# ---- recipes/cpu.sh QUIET=1: a failed run says why ------------------------------------------------------------------

QUIET_FAILURE = "[cpu.sh] verl failed (exit 1); the end of its log:"


def test_a_failed_quiet_run_prints_the_end_of_its_log_and_the_logs_path(tmp_path):
    """verl fails to start (a stand-in that cannot reach its Ray cluster, tests/recipe_standin.py): the recipe exits
    with verl's status and shows, on stderr, the last 25 lines of the run's console.log and the log's path; verl's
    whole output stays in the log."""
    run_dir = tmp_path / "runs" / "tepo-seed1"
    proc, verl_args = recipe_standin.run_cpu_recipe(tmp_path, RUN_DIR=str(run_dir), QUIET="1",
                                                    STANDIN_VERL_FAIL="could not reach the Ray cluster")
    assert verl_args is not None and "algorithm=tepo" in verl_args  # the recipe got as far as verl
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = run_dir / "console.log"
    logged = log.read_text().splitlines()
    assert len(logged) > recipe_standin.VERL_CHATTER
    assert logged[-1] == "ConnectionError: could not reach the Ray cluster"
    lines = proc.stderr.splitlines()
    assert lines[-1] == f"[cpu.sh] the whole log: {log}", proc.stderr
    shown = lines[lines.index(QUIET_FAILURE) + 1:-1]
    assert shown == ["    " + line for line in logged[-25:]], proc.stderr
    assert "verl console line" not in proc.stdout  # the rest of verl's output stays in the log


def test_a_quiet_run_that_succeeds_shows_nothing_of_verls_output(tmp_path):
    run_dir = tmp_path / "runs" / "tepo-seed1"
    proc, verl_args = recipe_standin.run_cpu_recipe(tmp_path, RUN_DIR=str(run_dir), QUIET="1")
    assert proc.returncode == 0 and verl_args is not None, proc.stdout + proc.stderr
    assert "verl console line" not in proc.stdout + proc.stderr and QUIET_FAILURE not in proc.stderr
    assert (run_dir / "console.log").read_text().count("verl console line") == recipe_standin.VERL_CHATTER


# ---- under CI=true a skip that bypasses the rule fails too (tests/conftest.py) -------------------------------------

#: A stand-in pytest run loads only the plugins it names: each installed one (Hypothesis, Hydra's, anyio's) costs
#: a second or two of CPU in every pytest process, and the stand-ins use none of them.
ONLY_NAMED_PLUGINS = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
WITH_XDIST = ("-p", "xdist.plugin")


def test_any_skip_fails_under_ci(tmp_path):
    """A bare pytest.skip / pytest.importorskip in a test skips off CI and fails under CI=true."""
    for name in ("conftest.py", "conftest_data.py", "conftest_e2e.py", "yaml_memo.py"):
        (tmp_path / name).write_text((Path(__file__).parent / name).read_text())
    (tmp_path / "test_bare.py").write_text(
        "import pytest\n\n"
        "def test_bare_skip():\n    pytest.skip('no frobnicator here')\n\n"
        "def test_importorskip():\n    pytest.importorskip('surely_not_installed_module')\n\n"
        "def test_passes():\n    pass\n")
    outer = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "PYTEST_ADDOPTS")
    for ci, expected in (("true", "2 failed, 1 passed"), ("", "1 passed, 2 skipped")):
        env = {k: v for k, v in os.environ.items() if k not in outer} | ONLY_NAMED_PLUGINS | {"CI": ci}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert expected in proc.stdout, (ci, proc.stdout[-2000:])
        if ci:
            assert "CI=true, and the test skipped (Skipped: no frobnicator here)" in proc.stdout, proc.stdout[-2000:]


#: Test files for the worker-sharing check: each test appends its worker, file and name to $ORDER_LOG. And how
#: each process ends, in $ORDER_LOG.exit: each file registers an exit handler and keeps an object whose finalizer
#: runs when the interpreter tears the module down.
_RECORD = """import atexit, os, pytest
def record(name):
    with open(os.environ["ORDER_LOG"], "a") as log:
        cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        log.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'master')} {__name__} {name} {cpus}\\n")
def note_end(event, open=open, path=os.environ["ORDER_LOG"] + ".exit",
             who=os.environ.get("PYTEST_XDIST_WORKER", "master")):
    with open(path, "a") as log:
        log.write(f"{who} {__name__} {event}\\n")
atexit.register(note_end, "exit-handler")
class _TornDown:
    def __del__(self):
        note_end("teardown")
_kept = _TornDown()
"""


def _cpu_list(cpus) -> str:
    """CPUs as the stand-in tests record them (_RECORD): sorted, comma-separated."""
    return ",".join(map(str, sorted(cpus)))


def _this_process_cpus() -> str:
    """The CPUs this test runs on now (under `make test` its worker may keep to part of them: read it at test time)."""
    return _cpu_list(os.sched_getaffinity(0))


#: The stand-in test files, each with its module-level marks (_standin_suite), and their modules.
_STANDIN_FILES = {"test_a.py": "", "test_e2e_b.py": "pytestmark = pytest.mark.e2e\n", "test_c.py": "",
                  "test_e2e_d.py": "pytestmark = pytest.mark.e2e\n"}
_MODULES = tuple(sorted(name.removesuffix(".py") for name in _STANDIN_FILES))


def _standin_suite(tmp_path):
    """Four stand-in test files (two end-to-end) under the suite's own conftest hooks; returns $ORDER_LOG's path."""
    (tmp_path / "conftest.py").write_text(  # the suite's conftest's hooks, loaded under another module name
        f"import importlib.util, sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(REPO / 'tests' / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_collection_modifyitems = suite.pytest_collection_modifyitems\n"
        "pytest_xdist_make_scheduler = suite.pytest_xdist_make_scheduler\n"
        "pytest_runtest_setup = suite.pytest_runtest_setup\n"
        "pytest_unconfigure = suite.pytest_unconfigure\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    e2e: a trainer run\n")
    for name, mark in _STANDIN_FILES.items():
        body = "".join(f"def test_{i}():\n    record({i})\n" for i in range(4))
        (tmp_path / name).write_text(_RECORD + mark + body)
    return tmp_path / "order.log"


def _run_standin(tmp_path, *args):
    log = _standin_suite(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}  # not this run's worker's
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, env={**env, **ONLY_NAMED_PLUGINS, "ORDER_LOG": str(log), "CI": ""},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line.split() for line in log.read_text().splitlines()]


def _ends(tmp_path) -> dict[str, list[tuple[str, str]]]:
    """How the stand-in run's processes ended: worker -> its (module, event)s, sorted (_RECORD)."""
    ends: dict[str, list[tuple[str, str]]] = {}
    for worker, module, event in (line.split() for line in (tmp_path / "order.log.exit").read_text().splitlines()):
        ends.setdefault(worker, []).append((module, event))
    return {worker: sorted(events) for worker, events in ends.items()}


def test_make_tests_xdist_sharing_keeps_a_file_on_one_worker_and_every_e2e_test_first_on_one(tmp_path):
    """tests/conftest.py's scopes under `make test`'s XDIST, on stand-in files: the end-to-end files' tests run on
    one worker, before anything else there and in file order; every other file's tests stay on one worker each."""
    runs = _run_standin(tmp_path, *WITH_XDIST, *XDIST.split())
    assert len(runs) == 16
    modules = ("test_a", "test_e2e_b", "test_c")
    workers = {module: {worker for worker, m, _, _ in runs if m == module} for module in modules}
    assert all(len(on) == 1 for on in workers.values()), workers
    e2e_worker = workers["test_e2e_b"].pop()
    on_it = [(module, int(name)) for worker, module, name, _ in runs if worker == e2e_worker]
    assert on_it[:8] == [("test_e2e_b", i) for i in range(4)] + [("test_e2e_d", i) for i in range(4)], on_it
    # the other worker keeps to the upper half of the CPUs from its first test on; the end-to-end worker to none
    upper_half = _cpu_list(suite_conftest.other_tests_cpus(os.sched_getaffinity(0)))
    assert {cpus for worker, _, _, cpus in runs if worker != e2e_worker} == {upper_half}, runs
    assert {cpus for worker, _, _, cpus in runs if worker == e2e_worker} == {_this_process_cpus()}, runs


def test_make_checks_workers_use_every_cpu_and_end_after_their_exit_handlers_without_teardown(tmp_path):
    """`make check` (-m "not e2e"): both workers run on every CPU. And each worker ends once its exit handlers have
    run, without the interpreter's teardown of its modules (the run without pytest-xdist below has one)."""
    runs = _run_standin(tmp_path, *WITH_XDIST, *XDIST.split(), "-m", "not e2e")
    assert len(runs) == 8 and len({worker for worker, _, _, _ in runs}) == 2
    assert {cpus for _, _, _, cpus in runs} == {_this_process_cpus()}
    assert _ends(tmp_path) == {worker: [(module, "exit-handler") for module in _MODULES] for worker in ("gw0", "gw1")}


@pytest.mark.parametrize("available, upper", [({0}, {0}), ({0, 1}, {1}), ({3, 5, 9}, {5, 9}), (set(range(16)),
                                                                                            set(range(8, 16)))])
def test_the_other_worker_takes_the_upper_half_of_the_cpus(available, upper):
    assert suite_conftest.other_tests_cpus(available) == upper


def test_the_suite_runs_without_pytest_xdist_end_to_end_files_first(tmp_path):
    """`python -m pytest` where pytest-xdist is absent (here not loaded): the conftest's xdist hook is optional,
    so the suite still runs, on one process, with the end-to-end files first."""
    runs = _run_standin(tmp_path)  # pytest-xdist not loaded
    order = [(module, int(name)) for _, module, name, _ in runs]
    assert order[:8] == [("test_e2e_b", i) for i in range(4)] + [("test_e2e_d", i) for i in range(4)], order
    assert len(order) == 16 and {worker for worker, _, _, _ in runs} == {"master"}
    assert {cpus for _, _, _, cpus in runs} == {_this_process_cpus()}
    # one process, not a worker: its exit handlers run, then the interpreter tears its modules down as usual
    assert _ends(tmp_path) == {"master": sorted((module, event) for module in _MODULES
                                                for event in ("exit-handler", "teardown"))}
