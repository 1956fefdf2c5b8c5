"""A verl platform for CPU (`VERL_PLATFORM=cpu`): device "cpu", gloo, Ray resource "GPU".

verl 0.9.1 knows nvidia/huawei/amd only and, with no accelerator, falls back to nvidia ("cuda", NCCL) and
rewrites `trainer.device=cpu` to cuda. This platform is registered under the name "cpu" by
`tepo_lab.cpu.install()` (only when TEPO_VERL_CPU=1). It reports the Ray resource "GPU" so verl's placement
(which counts GPUs) works with `ray_init.num_gpus=1` standing in for one CPU "device".
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase

PLATFORM_NAME = "cpu"


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _free_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class CpuDeviceModule(types.ModuleType):
    """`torch.cpu` plus the torch.cuda-style calls verl makes on its device module, as no-ops on CPU."""

    def __init__(self) -> None:
        super().__init__("tepo_lab.cpu.device_module", "torch.cpu with no-op accelerator memory/IPC calls")

    def __getattr__(self, name: str) -> Any:  # only reached for names not defined below
        return getattr(torch.cpu, name)

    # memory: nothing to free or count on CPU
    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def memory_allocated(device=None) -> int:
        return 0

    @staticmethod
    def max_memory_allocated(device=None) -> int:
        return 0

    @staticmethod
    def memory_reserved(device=None) -> int:
        return 0

    @staticmethod
    def max_memory_reserved(device=None) -> int:
        return 0

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction, device=None) -> None:
        return None

    @staticmethod
    def mem_get_info(device=None) -> tuple[int, int]:
        return _free_memory(), _total_memory()

    @staticmethod
    def memory_stats(device=None) -> dict:
        return {}

    # device
    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def set_device(device) -> None:
        return None

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    # RNG: the CPU generator is torch's default one
    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_rng_state(device=None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state, device=None) -> None:
        torch.set_rng_state(state)


DEVICE_MODULE = CpuDeviceModule()


class PlatformCPU(PlatformBase):
    """verl platform backend for CPU-only machines (selected by VERL_PLATFORM=cpu; never auto-detected)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Never win auto-detection: a CPU platform is chosen explicitly with VERL_PLATFORM=cpu.
        return False

    def current_device(self):  # noqa: D102 - FSDP on CPU needs a torch.device, an index 0 means "accelerator 0"
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for the logical "GPU" it assigns; nothing reads it on CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        # No CUDA IPC: verl's weight copy to vLLM then uses shared memory.
        return False

    def cudart(self) -> Any:
        return None


def register() -> type[PlatformCPU]:
    """Register PlatformCPU as "cpu"; if verl already resolved its platform and VERL_PLATFORM=cpu, replace it."""
    from verl.plugin.platform import platform_manager

    if platform_manager.PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        platform_manager.PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    current = platform_manager._current_platform
    wanted = os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME
    if wanted and current is not None and not isinstance(current, PlatformCPU):
        platform_manager.set_platform(PlatformCPU())
    return PlatformCPU
