"""The actor's memory on CPU, where verl's accelerator memory metrics read 0: the peak resident set size (RSS) of
the process during each update, logged as `perf/cpu_update_peak_rss_gb` (and the RSS when the update started as
`perf/cpu_update_start_rss_gb`), with the update's wall time inside the actor process as `perf/cpu_update_s`
(verl's own `timing_s/update_actor` also counts the dispatch and the data transfer around it).

Linux keeps the peak RSS of a process (VmHWM in /proc/self/status) and resets it when "5" is written to
/proc/self/clear_refs, so the peak of exactly one update is measured by resetting at its start. Before the reset,
glibc is asked to return the heap memory it keeps after earlier frees (`malloc_trim`), so the starting RSS is the
memory in use, not whatever the rollout and the old-log-prob pass left cached: the peak is then the memory the
update itself needs on top of what it starts with, comparable between runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
import time

GIB = 1024**3


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        match = re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1))


def rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """The peak RSS since the process started or since the last `reset_peak_rss()`."""
    return _status_kib("VmHWM") * 1024


def release_free_heap() -> None:
    """glibc's malloc_trim(0): give the heap's free memory back to the OS (a no-op where libc lacks it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def patch_update_peak_memory(module) -> None:
    """Wrap verl's TrainingWorker.train_mini_batch (one update_actor call) to log its peak RSS."""
    worker = module.TrainingWorker
    stock = getattr(worker.train_mini_batch, "__tepo_cpu_stock__", worker.train_mini_batch)

    @functools.wraps(stock)  # keeps verl's dispatch attributes
    def train_mini_batch(self, data):
        release_free_heap()
        reset_peak_rss()
        start = rss_bytes()
        began = time.perf_counter()
        output = stock(self, data)
        elapsed = time.perf_counter() - began
        if output is not None:
            from verl.utils import tensordict_utils as tu

            metrics = tu.get(output, "metrics")
            metrics["perf/cpu_update_peak_rss_gb"] = peak_rss_bytes() / GIB
            metrics["perf/cpu_update_start_rss_gb"] = start / GIB
            metrics["perf/cpu_update_s"] = elapsed
        return output

    train_mini_batch.__tepo_cpu_stock__ = stock
    worker.train_mini_batch = train_mini_batch
