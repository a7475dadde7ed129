"""verl on CPU: a platform and an engine registration through verl's own registries.

verl 0.9.1 ships platforms for CUDA, NPU and ROCm only, and registers its FSDP engine for "cuda" and "npu".
Its registries are the extension point for new hardware: this module registers a "cpu" platform with
`PlatformRegistry.register` and the existing FSDP engine (unchanged) for device "cpu" with
`EngineRegistry.register`. Nothing of verl is edited or patched.

Order matters: `verl.workers.engine` reads the device name when it is imported, so this module must run
first. In Ray workers verl imports it itself: `VERL_USE_EXTERNAL_MODULES=otel_rl.train.verl.platform`
(read by `verl/__init__.py`) with `VERL_PLATFORM=cpu` (see `worker_env`).
"""

import os
from contextlib import contextmanager
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM = "cpu"


class CPUDevice:
    """What verl asks of `torch.<device>` beyond `torch.cpu`: memory figures (process RSS: a CPU has no
    allocator statistics), seeds, and the no-ops of a device without caches or streams."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)  # is_available, synchronize, current_device, device_count, Stream...

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return psutil.Process().memory_info().rss

    max_memory_allocated = memory_reserved = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """Host CPU, one "device" per process; collectives over gloo."""

    device = CPUDevice()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return self.device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu chooses it, so GPU machines keep their platform.
        return False

    def current_device(self) -> str:  # type: ignore[override]
        # verl moves tensors with `.to(get_device_id())`: "cpu" is where they live (an int means cuda:N).
        return "cpu"

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
        return "OTEL_RL_VERL_VISIBLE_CPUS"  # nothing reads it: every worker sees the host

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {}  # the placement group's CPU bundle is the whole reservation

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a verl worker process on CPU: this platform, loaded by verl's own hook."""
    return {
        "VERL_PLATFORM": PLATFORM,
        "VERL_USE_EXTERNAL_MODULES": __name__,
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }


def _register_engine() -> None:
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != PLATFORM:
        return  # a GPU process: verl's own engines serve its device
    # Imported here, after the platform above is registered: this import reads the device name.
    from verl.workers.engine import EngineRegistry, FSDPEngineWithLMHead

    language_models = EngineRegistry._engines.get("language_model", {})
    if PLATFORM in language_models.get("fsdp2", {}):
        return  # already registered in this process
    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM)(
        FSDPEngineWithLMHead
    )


# In a worker, verl imports this module from inside `import verl` (VERL_USE_EXTERNAL_MODULES), before any
# engine module: the registration happens there, with the platform already known.
_register_engine()
