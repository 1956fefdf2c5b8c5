"""A shared pool of grader processes whose overrunning tasks are killed (pebble.ProcessPool).

Why processes: a thread cannot be interrupted, `signal.alarm` only works in the main thread, and some inputs make
sympy run for minutes or forever (e.g. `\\boxed{9^{9^{9^{9}}}}` is a C-level big-integer power that no Python-level
timeout can interrupt). pebble terminates the worker that runs past its task's timeout and starts a new one, so
a call returns within `timeout_s` of wall time whatever the response, and a stuck grading never blocks the
other calls for longer.

The pool is created lazily, once per process (a forked child gets its own), shared by all threads, and closed at
interpreter exit. Workers start with "forkserver" on Linux (fork from a clean server process: safe from a
multithreaded Ray worker, and cheap because the server preloads math-verify) and "spawn" elsewhere.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeoutError

from pebble import ProcessExpired, ProcessPool

_GRADER_MODULE = "tepo_verl.reward.grader"
#: Limit on the pool's one-off start (first worker up and math-verify imported).
STARTUP_TIMEOUT_S = 120.0


def _ready() -> bool:
    """The start-up probe: imports the grader in the worker (preloaded by the forkserver on Linux)."""
    import tepo_verl.reward.grader  # noqa: F401

    return True


class GraderTimeout(Exception):
    """The grading ran past its time limit and its worker process was terminated."""


class GraderPool:
    """A lazily started, fork-aware pebble ProcessPool running `tepo_verl.reward.grader.grade`."""

    def __init__(self, max_workers: int | None = None, start_method: str | None = None) -> None:
        self.max_workers = max_workers or int(os.environ.get("TEPO_REWARD_WORKERS", "0")) or min(4, os.cpu_count() or 1)
        self.start_method = start_method or os.environ.get("TEPO_REWARD_START_METHOD") or default_start_method()
        self._lock = threading.Lock()
        self._pool: ProcessPool | None = None
        self._pid: int | None = None

    def _get(self) -> ProcessPool:
        with self._lock:
            if self._pool is None or self._pid != os.getpid() or not self._pool.active:
                context = multiprocessing.get_context(self.start_method)
                if self.start_method == "forkserver":
                    context.set_forkserver_preload([_GRADER_MODULE])
                pool = ProcessPool(max_workers=self.max_workers, context=context)
                # Wait for the first worker (forkserver start + math-verify import: seconds on a busy machine)
                # here, once, so that start-up is not charged to the first responses' time limit.
                try:
                    pool.schedule(_ready).result(timeout=STARTUP_TIMEOUT_S)
                except BaseException as error:
                    pool.stop()
                    raise RuntimeError(f"the grader pool did not start: {error!r}") from error
                self._pool = pool
                self._pid = os.getpid()
            return self._pool

    def grade(self, solution: str, ground_truths: tuple[str, ...], timeout_s: float) -> tuple[bool, str]:
        """Run `grade` in a worker; raise GraderTimeout once `timeout_s` of wall time has passed since the call.

        The bound covers queueing behind other calls and the grading itself: a worker still grading at the
        deadline is terminated (pebble replaces it), a queued call is withdrawn. Only the pool's one-off
        start in this process (`_get`, which waits for its first worker) is not charged to the call.
        """
        from tepo_verl.reward.grader import grade

        pool = self._get()
        deadline = time.monotonic() + timeout_s
        future = pool.schedule(grade, args=(solution, ground_truths), timeout=timeout_s)
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeoutError as error:  # pebble's run-time limit, or our wall-clock deadline
            future.cancel()  # a running task's worker is terminated; a queued one never starts
            raise GraderTimeout(f"grading took longer than {timeout_s} s") from error
        except ProcessExpired as error:  # the worker died (e.g. out of memory): treat like a timeout
            raise GraderTimeout(f"grader process died: {error}") from error

    def close(self) -> None:
        """Stop the workers now (running tasks are abandoned)."""
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.stop()
                self._pool.join(timeout=5)
            self._pool = None


def default_start_method() -> str:
    return "forkserver" if sys.platform.startswith("linux") else "spawn"


_SHARED: GraderPool | None = None
_SHARED_LOCK = threading.Lock()


def shared_pool() -> GraderPool:
    """The process-wide pool (created on first use)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = GraderPool()
            atexit.register(_SHARED.close)
        return _SHARED
