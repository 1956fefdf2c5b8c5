"""End to end, verl's real trainer on CPU (recipes/cpu.sh) on the code paths of real cluster jobs:

- a Ray cluster started beforehand (`ray start --head`, then RAY_ADDRESS): what every multi-node job does. The head
  is started WITHOUT the variables the recipe exports, so the trainer (a Ray actor) gets them from verl's runtime
  env or not at all; the metrics must land in the run folder and `tepo-verl compare` must read them;
- a preempted run resumed from its checkpoint: the run saves a checkpoint at step 2 of 4 and is killed, then runs
  again into the same folder and resumes to step 4. Its metrics (two segments) hold steps 1-4 once each, and
  compare's row equals an uninterrupted run's in steps and validations.

Each training holds $TEPO_TRAIN_LOCK (conftest_e2e). The Ray head is stopped at the end by the ids of its own
processes (found by its unique temp dir): `ray stop` would stop every Ray cluster on the machine. Marked `e2e`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest_e2e  # noqa: E402
from conftest_e2e import REPO, metric, run_recipe, training_lock  # noqa: E402

from tepo_verl.report.compare import run_row  # noqa: E402
from tepo_verl.report.runs import load_run, load_runs, segments  # noqa: E402

pytestmark = pytest.mark.e2e

ALGO = "tepo"
TRAINING = "critic/score/mean"  # logged at every training step (not by a validation)
#: What recipes/cpu.sh exports for the Ray processes; the pre-started head must not have any of it.
RECIPE_EXPORTS = ("TEPO_VERL_CPU", "VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VLLM_CPU_KVCACHE_SPACE",
                  "VLLM_CPU_OMP_THREADS_BIND", "TOKENIZERS_PARALLELISM", "VERL_FILE_LOGGER_PATH", "TQ_NUM_THREADS")


@pytest.fixture(scope="module", autouse=True)
def cpu_stack():
    conftest_e2e.require_cpu_stack()


def _processes_mentioning(marker: str) -> list[int]:
    """Ids of this user's processes whose command line or environment contains `marker` (a unique path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in text:
            found.append(int(entry.name))
    return found


def _stop(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.5)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _steps(run) -> tuple[list[int], list[int]]:
    """(training steps, validated steps) of a loaded run."""
    return [s for s, m in run.metrics.items() if TRAINING in m], [s for s, _ in run.val_accuracy()]


# ------------------------------------------------------------------ a Ray cluster started beforehand

@pytest.fixture(scope="module")
def ray_head():
    """`ray start --head --num-cpus=16 --num-gpus=1` (the resources the CPU recipe asks of its local Ray) in a fresh
    temp dir, from an environment without the recipe's variables; yields RAY_ADDRESS."""
    temp_dir = tempfile.mkdtemp(prefix="tepo-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in RECIPE_EXPORTS and k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"  # a local test cluster: Ray 2.60 would ask clients for a token otherwise
    ray = Path(sys.executable).with_name("ray")
    start = subprocess.run([str(ray), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                            "--num-cpus=16", "--num-gpus=1", f"--temp-dir={temp_dir}", "--include-dashboard=false",
                            "--object-store-memory=1000000000", "--disable-usage-stats"],
                           env=env, capture_output=True, text=True, timeout=300)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        yield {"address": f"127.0.0.1:{port}", "temp_dir": Path(temp_dir)}
    finally:
        _stop(_processes_mentioning(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory, ray_head):
    """Four steps, validated every two, on the pre-started cluster: also the uninterrupted run the resumed one is
    compared with."""
    runs = tmp_path_factory.mktemp("cluster") / "runs"
    return {**run_recipe(runs / f"{ALGO}-seed1", ALGO, 4, RAY_ADDRESS=ray_head["address"], TEST_FREQ="2"),
            "runs": runs}


def test_cpu_recipe_on_a_pre_started_ray_cluster_logs_into_the_run_folder(cluster_run, ray_head, tmp_path):
    console, run_dir = cluster_run["console"], cluster_run["dir"]
    assert "Connected to Ray cluster" in console and "Started a local Ray instance" not in console, console[-3000:]
    assert "num_cpus and num_gpus must not be provided" not in console
    # the file logger wrote into the run folder (run_recipe fails the test when it did not), every step
    assert [r["step"] for r in cluster_run["records"] if TRAINING in r["data"]] == [1, 2, 3, 4]
    # and not into the worker's working directory, the logger's default without VERL_FILE_LOGGER_PATH
    assert not list(ray_head["temp_dir"].rglob(f"{run_dir.name}.jsonl"))
    # the plugin loaded in the Ray processes on their own (the head never saw the recipe's variables): the actor
    # worker ran TEPO's loss with the preset's mask rule, and the trainer logged the plugin's run metrics
    for record in (r for r in cluster_run["records"] if TRAINING in r["data"]):
        data = record["data"]
        assert metric(data, "tepo/mask_rule/surprisal_old") == 1.0, (record["step"], sorted(data))
        assert metric(data, "tepo_verl/responses_generated") > 0, record["step"]
    compare = subprocess.run([sys.executable, "-m", "tepo_verl.report.compare", str(cluster_run["runs"]), "--out",
                              str(tmp_path / "compare"), "--no-plots", "--resamples", "200"],
                             capture_output=True, text=True, timeout=600, cwd=REPO)
    assert compare.returncode == 0, compare.stderr[-3000:]
    assert [r.path for r in load_runs([str(cluster_run["runs"])])] == [run_dir / "metrics.jsonl"]
    assert ALGO in (tmp_path / "compare" / "compare.md").read_text()


# ------------------------------------------------------------------ preempted and resumed

def _preempted_run(run_dir: Path, steps: int, *overrides: str, **env: str) -> None:
    """Start recipes/cpu.sh; once step 2 is logged (after its checkpoint is saved), kill it and everything it started,
    as a preemption does."""
    full_env = {**os.environ, "ALGO": ALGO, "STEPS": str(steps), "RUN_DIR": str(run_dir), "PYTHON": sys.executable,
                "COMPARE": "0", "QUIET": "1", **env}
    full_env.pop("VERL_FILE_LOGGER_PATH", None)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = run_dir / "metrics.jsonl"
    with training_lock():
        proc = subprocess.Popen(["bash", str(REPO / "recipes" / "cpu.sh"), *overrides], env=full_env, cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + int(os.environ.get("TEPO_E2E_TIMEOUT", "900"))
            while not any(r["step"] == 2 and TRAINING in r["data"] for r in _records(metrics)):
                if proc.poll() is not None:
                    pytest.fail(f"the run ended (rc={proc.returncode}) before step 2:\n"
                                f"{(run_dir / 'console.log').read_text()[-3000:]}", pytrace=False)
                if time.monotonic() > deadline:
                    pytest.fail("no step 2 before the timeout", pytrace=False)
                time.sleep(1)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _stop(_processes_mentioning(str(run_dir)))  # Ray's processes carry the run folder in their runtime env


def test_a_preempted_run_resumes_without_losing_metrics(tmp_path, cluster_run):
    every_two = ("trainer.save_freq=2",)
    whole = cluster_run  # uninterrupted, the same steps and validation frequency
    run_dir = tmp_path / "resumed" / f"{ALGO}-seed1"
    _preempted_run(run_dir, 4, *every_two, TEST_FREQ="2")
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    resumed = run_recipe(run_dir, ALGO, 4, *every_two, TEST_FREQ="2")
    assert "resuming: kept the metrics so far as metrics.segment-1.jsonl" in resumed["console"]
    metrics = run_dir / "metrics.jsonl"
    assert segments(metrics) == [run_dir / "metrics.segment-1.jsonl", metrics]
    first, second = (_records(path) for path in segments(metrics))
    assert {r["step"] for r in first if TRAINING in r["data"]} >= {1, 2}  # what the killed run logged
    assert [r["step"] for r in second if TRAINING in r["data"]] == [3, 4]  # resumed after the checkpoint at 2
    joined, reference = load_run(metrics), load_run(whole["dir"] / "metrics.jsonl")
    training, validated = _steps(joined)
    assert training == [1, 2, 3, 4]  # every step once, in order
    assert (training, validated) == _steps(reference) == ([1, 2, 3, 4], [0, 2, 4])
    ours, theirs = run_row(joined, 0.5), run_row(reference, 0.5)
    assert (ours["steps"], ours["validations"]) == (theirs["steps"], theirs["validations"]) == (4, 3)
    assert load_runs([str(tmp_path / "resumed")])[0].path == metrics  # one run, not one per segment
