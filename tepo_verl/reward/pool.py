"""A shared pool of grader processes whose overrunning tasks are killed (pebble.ProcessPool).

Why processes: a thread cannot be interrupted, `signal.alarm` only works in the main thread, and some inputs make
sympy run for minutes or forever (e.g. `\\boxed{9^{9^{9^{9}}}}` is a C-level big-integer power that no Python-level
timeout can interrupt). pebble terminates the worker that runs past its task's timeout and starts a new one, so
a stuck grading costs at most `timeout_s` and never blocks the other calls.

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
from concurrent.futures import TimeoutError as FutureTimeoutError

from pebble import ProcessExpired, ProcessPool

_GRADER_MODULE = "tepo_verl.reward.grader"


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
                self._pool = ProcessPool(max_workers=self.max_workers, context=context)
                self._pid = os.getpid()
            return self._pool

    def grade(self, solution: str, ground_truths: tuple[str, ...], timeout_s: float) -> tuple[bool, str]:
        """Run `grade` in a worker; raise GraderTimeout past `timeout_s` of run time (queueing not counted)."""
        from tepo_verl.reward.grader import grade

        future = self._get().schedule(grade, args=(solution, ground_truths), timeout=timeout_s)
        try:
            return future.result()
        except FutureTimeoutError as error:
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
