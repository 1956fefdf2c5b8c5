"""The CPU mode's update-memory metric: peak RSS of one update, measured with Linux's resettable VmHWM."""

from __future__ import annotations

import fresh_python

from tepo_lab.cpu import memory


def test_peak_rss_resets_and_sees_a_later_allocation():
    big = bytearray(300 * 1024**2)  # touched: 300 MiB resident
    big[:: 4096] = b"\1" * len(big[:: 4096])
    del big
    memory.reset_peak_rss()
    after_reset = memory.peak_rss_bytes()
    assert after_reset < memory.rss_bytes() + 64 * 1024**2  # the 300 MiB peak is forgotten
    small = bytearray(100 * 1024**2)
    small[:: 4096] = b"\1" * len(small[:: 4096])
    peak = memory.peak_rss_bytes()
    del small
    assert peak - after_reset > 90 * 1024**2


def test_the_wrapped_train_mini_batch_keeps_verl_dispatch_attributes():
    code = (
        "import verl.workers.engine_workers as w\n"
        "from verl.single_controller.base.decorator import MAGIC_ATTR\n"
        "from tepo_lab.cpu.memory import patch_update_peak_memory\n"
        "stock = w.TrainingWorker.train_mini_batch\n"
        "patch_update_peak_memory(w)\n"
        "patch_update_peak_memory(w)\n"  # idempotent: wraps the stock function once
        "new = w.TrainingWorker.train_mini_batch\n"
        "assert new is not stock and new.__tepo_cpu_stock__ is stock\n"
        "assert getattr(new, MAGIC_ATTR) == getattr(stock, MAGIC_ATTR)\n"
        "print('ok')\n"
    )
    result = fresh_python.run(["-c", code])
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_release_free_heap_returns_freed_small_allocations_to_the_os():
    chunks = [bytearray(4096) for _ in range(100_000)]  # ~400 MiB of heap (below the mmap threshold)
    for chunk in chunks:
        chunk[0] = 1
    held = memory.rss_bytes()
    del chunks
    memory.release_free_heap()
    assert held - memory.rss_bytes() > 200 * 1024**2
