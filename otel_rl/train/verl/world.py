"""How many ranks verl's workers run on, and whether this machine can hold them.

`world_size` (the training configuration's, `otel-rl demo --world-size`) is the number of data-parallel
ranks of verl's FSDP2 engine, over all nodes: verl's `trainer.nnodes × trainer.n_gpus_per_node`. Each rank
takes a contiguous slice of every batch (verl's dispatch chunks it) and the gradients are averaged over the
ranks, so the update is the same at any world size. Checked when the configuration is read: a world size
this machine cannot hold stops before any process starts.
"""

import os


def machine_ranks(device: str) -> tuple[int, str]:
    """How many ranks this machine holds on `device`, and what that is, in words."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        return count, f"{count} GPU{'s' if count != 1 else ''}"
    # One process per rank, each computing: a rank per core this process may run on (cgroup/affinity).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores, f"{cores} CPU core{'s' if cores != 1 else ''}"


def check_world_size(world_size: int, nnodes: int, device: str) -> None:
    """Raise ValueError("world_size: ...") when the ranks do not split over the nodes, or when this node's
    share does not fit this machine. With RAY_ADDRESS the ranks run on a cluster someone started, whose
    nodes Ray places them on: only the split is checked here."""
    if world_size % nnodes:
        raise ValueError(
            f"world_size: {world_size} ranks do not split evenly over verl.trainer.nnodes={nnodes} nodes"
        )
    if os.environ.get("RAY_ADDRESS"):
        return
    if nnodes > 1:
        raise ValueError(
            f"world_size: verl.trainer.nnodes={nnodes} needs a Ray cluster of that many nodes (RAY_ADDRESS, "
            "docs/verl.md#several-nodes-on-ray); without one the ranks run on this machine"
        )
    per_node = world_size // nnodes
    held, what = machine_ranks(device)
    if per_node > held:
        raise ValueError(
            f"world_size: {world_size} ranks on {device} need {per_node} "
            f"{'GPUs' if device == 'cuda' else 'CPU cores'} on this node; this machine has {what}"
        )
