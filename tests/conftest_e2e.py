"""Helpers for the end-to-end tests of verl's real trainer on CPU (a plain module, imported as `conftest_e2e`
after putting this folder on sys.path, like conftest_data).

`require_cpu_stack()` skips with the reason on a machine without the tested CPU stack, and FAILS under CI=true:
CI installs the stack, so a missing or mismatched one is a bug there, never a reason to test less. (Whether the
plugin loads the CPU mode is the product's behaviour, not a prerequisite: tests/test_cpu_mode.py checks it, and the
trainer runs fail without it.) `run_recipe()` runs recipes/cpu.sh and returns what verl logged.

Every run connects to one Ray head per pytest run (`shared_ray_head()`: `ray start --head`, as every multi-node job
starts its cluster), so the pre-started-cluster path is the tested default and no run pays for a Ray start of its
own; `own_ray=True` gives a run a local Ray instead (RAY_ADDRESS unset: the recipe's default on one machine). The
head is started by the first run that needs it and stopped when the pytest run ends (tests/conftest.py), by the ids
of its own processes: `ray stop` would stop every Ray cluster on the machine. Every connection stays on loopback
(`LOOPBACK`). From the head's start until the pytest run ends, the run holds $TEPO_TRAIN_LOCK (when set), so that a
study's training cannot slip in between its trainings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest_data import in_ci, skip_or_fail  # noqa: F401  (one rule for every prerequisite: skip here, fail in CI)

REPO = Path(__file__).resolve().parents[1]
#: What recipes/cpu.sh exports for the Ray processes; the pre-started head has none of it, so the trainer (a Ray actor)
#: gets these from verl's runtime env or not at all, as on a cluster started beforehand.
RECIPE_EXPORTS = ("TEPO_VERL_CPU", "VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VLLM_CPU_KVCACHE_SPACE",
                  "VLLM_CPU_OMP_THREADS_BIND", "TOKENIZERS_PARALLELISM", "VERL_FILE_LOGGER_PATH", "TQ_NUM_THREADS")
#: For the head and every Ray client: a Ray client turns 127.0.0.1 in an address into the machine's own address
#: (ray._private.services.resolve_ip_for_localhost), unless Ray runs as a single-node cluster, which this switch
#: (meant for macOS and Windows) makes it: the head's node address is then 127.0.0.1 and every client connects there.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: The start of the adapter's one-line precision warning (tepo_verl/verl_adapter/precision.py), as a run's console
#: shows it when the loss gets log-probs too coarse for its clip range.
PRECISION_WARNING = "[tepo-verl] WARNING: the actor's log-probs arrive in"


def cpu_stack_problem() -> str | None:
    """Why verl's trainer cannot run on this machine's CPU (None when it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (install the CPU stack: bash lab/tepo_lab/cpu/install_cpu.sh)"
    if importlib.util.find_spec("verl") is None:
        return "verl is not installed"
    from tepo_lab.cpu.versions import mismatches

    bad = mismatches()
    if bad:
        return "the tested CPU stack is not installed: " + "; ".join(bad)
    return None


def require_cpu_stack() -> None:
    problem = cpu_stack_problem()
    if problem is not None:
        skip_or_fail(problem)


def metric(data: dict, name: str):
    """A logged value by its name with or without verl's `actor/` worker prefix (None when absent)."""
    for key in (name, f"actor/{name}"):
        if key in data:
            return data[key]
    return None


def assert_step_updated(data: dict, step: int) -> None:
    """One logged training step of a loss whose token ratios clip at 0.2 (first mini-batch on-policy): a finite loss,
    and a non-zero gradient whenever the batch held a response with a non-zero advantage (a group whose rewards
    differ). A step whose groups all got equal rewards gives the policy term nothing to learn from, so its gradient
    may be 0; that is the data, not a broken update."""
    assert math.isfinite(metric(data, "pg_loss")), step
    informative = data["critic/advantages/max"] > 0 or data["critic/advantages/min"] < 0
    assert metric(data, "grad_norm") > 0 or not informative, (step, metric(data, "grad_norm"))


#: This process's hold on $TEPO_TRAIN_LOCK: its open file and how many holders share it (the flock is taken once).
_lock = {"handle": None, "holders": 0}


def _take_training_lock() -> None:
    path = os.environ.get("TEPO_TRAIN_LOCK")
    if not path:
        return
    if _lock["holders"] == 0:
        handle = open(path, "a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        _lock["handle"] = handle
    _lock["holders"] += 1


def _release_training_lock() -> None:
    if _lock["holders"] == 0:
        return
    _lock["holders"] -= 1
    if _lock["holders"] == 0:
        handle, _lock["handle"] = _lock["handle"], None
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


@contextlib.contextmanager
def training_lock():
    """Hold an exclusive flock on $TEPO_TRAIN_LOCK (when set) while a training runs, so that the tests never train
    beside another training on a shared machine (benchmarks/study.py --lock takes the same flock). Re-entrant: once
    the pytest run's Ray head is up, the run holds it until its end (shared_ray_head)."""
    _take_training_lock()
    try:
        yield
    finally:
        _release_training_lock()


def processes_mentioning(marker: str) -> list[int]:
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


def stop_processes(pids: list[int], signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGKILL)) -> None:
    """Each of `signals` in turn (by default SIGTERM, then SIGKILL what is left after 20 s); returns once they are
    gone (or 20 s after the last)."""
    for sig in signals:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.5)


@dataclasses.dataclass(frozen=True)
class RayHead:
    address: str  # 127.0.0.1:<port>, what RAY_ADDRESS gets
    temp_dir: Path  # its own: every process of the head carries it on its command line
    started: str  # what `ray start` printed, without its colours


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def start_ray_head(attempts: int = 3) -> RayHead:
    """`ray start --head --num-cpus=16 --num-gpus=1` (the resources the CPU recipe asks of a local Ray) on loopback, in
    a fresh temp dir, from an environment without the recipe's variables. Its ports are free ones, not Ray's fixed
    defaults, so that it starts beside another Ray on the machine (a training study's). On a loaded machine the raylet
    can give up waiting for its agent (a fixed 30 s in Ray 2.60): then it tries again, `attempts` times in all."""
    for _ in range(attempts):
        head, returncode = _start_ray_head_once()
        if returncode == 0:
            return head
        stop_ray_head(head)
    pytest.fail(f"`ray start --head` failed {attempts} times; the last (rc={returncode}):\n{head.started[-3000:]}",
                pytrace=False)


def _start_ray_head_once() -> tuple[RayHead, int]:
    temp_dir = tempfile.mkdtemp(prefix="tepo-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    gcs, dashboard, agent, client = _free_ports(4)
    env = {k: v for k, v in os.environ.items() if k not in RECIPE_EXPORTS and k != "RAY_ADDRESS"} | LOOPBACK
    env["RAY_AUTH_MODE"] = "disabled"  # a local test cluster: Ray 2.60 would ask clients for a token otherwise
    ray = Path(sys.executable).with_name("ray")
    command = [str(ray), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=16",
               "--num-gpus=1", f"--temp-dir={temp_dir}", "--include-dashboard=false", f"--dashboard-port={dashboard}",
               f"--dashboard-agent-listen-port={agent}", f"--ray-client-server-port={client}",
               "--object-store-memory=1000000000", "--disable-usage-stats"]
    try:
        start = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        printed, returncode = start.stdout + start.stderr, start.returncode
    except subprocess.TimeoutExpired:
        printed, returncode = "`ray start` gave no answer in 300 s", -1
    printed = re.sub(r"\x1b\[[0-9;]*m", "", printed)  # without its colours
    return RayHead(f"127.0.0.1:{gcs}", Path(temp_dir), printed), returncode


def stop_ray_head(head: RayHead) -> None:
    stop_processes(processes_mentioning(str(head.temp_dir)))
    shutil.rmtree(head.temp_dir, ignore_errors=True)


_shared_head: RayHead | None = None


def shared_ray_head() -> RayHead:
    """The pytest run's Ray head, started on the first call. From then until the run ends the run holds
    $TEPO_TRAIN_LOCK (when set): its trainings are one block, which no other training on the machine (a study's)
    slips in between, and the head starts on a machine no training loads."""
    global _shared_head
    if _shared_head is None:
        _take_training_lock()
        try:
            _shared_head = start_ray_head()
        except BaseException:
            _release_training_lock()
            raise
    return _shared_head


def stop_shared_ray_head() -> None:
    """Stop the pytest run's Ray head, if a run started it, and let go of the lock it held (tests/conftest.py calls
    this when the run ends)."""
    global _shared_head
    if _shared_head is not None:
        head, _shared_head = _shared_head, None
        try:
            stop_ray_head(head)
        finally:
            _release_training_lock()


def recipe_env(run_dir: Path, algo: str, steps: int, own_ray: bool = False, **env: str) -> dict:
    """The environment of `ALGO=algo STEPS=steps bash recipes/cpu.sh` into run_dir, connected to the pytest run's Ray
    head (started here if it is not yet), or with a Ray of its own (`own_ray`)."""
    full_env = {**os.environ, "ALGO": algo, "STEPS": str(steps), "RUN_DIR": str(run_dir), "PYTHON": sys.executable,
                "COMPARE": "0", **LOOPBACK, **env}
    full_env.pop("VERL_FILE_LOGGER_PATH", None)
    full_env.pop("RAY_ADDRESS", None)
    if not own_ray:
        full_env["RAY_ADDRESS"] = shared_ray_head().address
    return full_env


def composed_config(run_dir: Path, console: str):
    """The config the trainer ran with, as Hydra saved it (run_dir/outputs/<date>/<time>/.hydra/config.yaml; the
    newest when the folder holds several runs). Read from the file, not from verl's printout of it in the console,
    which Ray's log streaming can split in the middle of a `'key': value` pair."""
    from omegaconf import OmegaConf

    saved = sorted(run_dir.glob("outputs/*/*/.hydra/config.yaml"))
    if not saved:
        pytest.fail(f"Hydra saved no config under {run_dir}/outputs:\n{console[-3000:]}", pytrace=False)
    return OmegaConf.load(saved[-1])


def run_recipe(run_dir: Path, algo: str, steps: int, *overrides: str, own_ray: bool = False, **env: str) -> dict:
    """`ALGO=algo STEPS=steps bash recipes/cpu.sh overrides...` into run_dir, on the pytest run's Ray head (or, with
    `own_ray`, a Ray of its own); returns its console, composed config and records.

    The console goes to run_dir/pytest-console.log too. Fails the calling test with the end of the console when
    the recipe fails or the file logger wrote nothing.
    """
    with training_lock():
        full_env = recipe_env(run_dir, algo, steps, own_ray, **env)
        proc = subprocess.run(
            ["bash", str(REPO / "recipes" / "cpu.sh"), *overrides], env=full_env, cwd=REPO, capture_output=True,
            text=True, timeout=int(os.environ.get("TEPO_E2E_TIMEOUT", "900")),
        )
    console = proc.stdout + proc.stderr
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "pytest-console.log").write_text(console)
    if proc.returncode != 0:
        pytest.fail(f"recipes/cpu.sh ALGO={algo} failed (rc={proc.returncode}):\n{console[-6000:]}", pytrace=False)
    jsonl = run_dir / "metrics.jsonl"
    if not jsonl.exists():
        pytest.fail(f"verl's file logger wrote nothing at {jsonl}:\n{console[-3000:]}", pytrace=False)
    logged = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    return {
        "dir": run_dir,
        "console": console,
        "config": composed_config(run_dir, console),
        "logged": logged,
        "by_step": {record["step"]: record["data"] for record in logged},
        "records": [record for record in logged if record["step"] >= 1],  # step 0: validation before training
    }
