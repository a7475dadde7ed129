"""How many ranks verl's workers run on, and whether this machine or the Ray cluster can hold them.

`world_size` (the training configuration's, `otel-rl demo --world-size`) is the number of data-parallel
ranks of verl's FSDP2 engine, over all nodes: verl's `trainer.nnodes × trainer.n_gpus_per_node`. Each rank
takes a contiguous slice of every batch (verl's dispatch chunks it) and the gradients are averaged over the
ranks, so the update is the same at any world size. Checked when the configuration is read: a world size
this machine cannot hold stops before any process starts.

On several nodes the ranks run on a Ray cluster someone started: `ray_address` (the configuration's), else
the RAY_ADDRESS environment variable. Whether it answers and holds the ranks is checked when the trainer
starts, before it loads the model or starts a worker (reading a configuration must not need the cluster:
`otel-rl tasks probe` reads the same file). `ray.init` itself waits for a dead address without end.
"""

import os
import socket
from typing import Any

PROBE_TIMEOUT_S = 5.0  # per probe: a cluster's head answers a TCP connect and gRPC's handshake in ms


def machine_ranks(device: str) -> tuple[int, str]:
    """How many ranks this machine holds on `device`, and what that is, in words."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        return count, f"{count} GPU{'s' if count != 1 else ''}"
    # One process per rank, each computing: a rank per core this process may run on (cgroup/affinity).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores, f"{cores} CPU core{'s' if cores != 1 else ''}"


def check_world_size(world_size: int, nnodes: int, device: str, ray_address: str | None = None) -> None:
    """Raise ValueError("world_size: ...") when the ranks do not split over the nodes, or when this node's
    share does not fit this machine. On a Ray cluster (`ray_address`, or RAY_ADDRESS) Ray places the ranks
    on its nodes: only the split is checked here, the cluster when the trainer joins it."""
    if world_size % nnodes:
        raise ValueError(
            f"world_size: {world_size} ranks do not split evenly over verl.trainer.nnodes={nnodes} nodes"
        )
    if ray_cluster(ray_address):
        return
    if nnodes > 1:
        raise ValueError(
            f"world_size: verl.trainer.nnodes={nnodes} needs a Ray cluster of that many nodes (ray_address "
            "or RAY_ADDRESS, docs/verl.md#several-nodes-on-ray); without one the ranks run on this machine"
        )
    per_node = world_size // nnodes
    held, what = machine_ranks(device)
    if per_node > held:
        raise ValueError(
            f"world_size: {world_size} ranks on {device} need {per_node} "
            f"{'GPUs' if device == 'cuda' else 'CPU cores'} on this node; this machine has {what}"
        )


def ray_cluster(ray_address: str | None) -> tuple[str, str] | None:
    """The Ray cluster to join and the name of what says so: the `ray_address` setting, else RAY_ADDRESS;
    None when the trainer starts Ray on this machine itself."""
    if ray_address:
        return ray_address, "ray_address"
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    return None


def check_ray_address(address: str) -> None:
    """Raise ValueError("ray_address: ...") unless `address` is a cluster's host:port (ray:// allowed)."""
    if _host_port(address) is None:
        raise ValueError(
            f"ray_address: expected the head's host:port (as `ray start --head` prints it), got {address!r}"
        )


def check_ray_answers(address: str, name: str) -> None:
    """Raise ValueError("<name>: ...") unless a gRPC server (a Ray head's GCS, or its client server for
    ray://) answers at `address` within PROBE_TIMEOUT_S, twice: a TCP connect, then gRPC's handshake (a
    port some other server holds accepts the connect). Addresses Ray resolves itself ("auto") pass."""
    target = _host_port(address)
    if target is None:
        return
    import grpc

    try:
        socket.create_connection(target, timeout=PROBE_TIMEOUT_S).close()
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise ValueError(f"{name}: no Ray cluster answers at {address} ({reason})") from None
    channel = grpc.insecure_channel(address.removeprefix("ray://"))
    try:
        grpc.channel_ready_future(channel).result(timeout=PROBE_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        raise ValueError(
            f"{name}: no Ray cluster answers at {address} (the port is open but no gRPC server answered in "
            f"{PROBE_TIMEOUT_S:.0f} s: give the head's GCS port, as `ray start --head` prints it)"
        ) from None
    finally:
        channel.close()


def check_cluster_holds(
    nodes: list[dict[str, Any]], name: str, address: str, nnodes: int, per_node: int, device: str, groups: int
) -> None:
    """Raise ValueError("<name>: ...") naming the cluster's live nodes unless `nnodes` of them each hold a
    node's share of verl's placement (trainer.py's resource pool): `per_node` bundles of `groups` CPUs
    (a worker a group: the actor, the reference) and, on cuda, a GPU each. `nodes` is ray.nodes()."""
    cpus, gpus = per_node * groups, per_node if device == "cuda" else 0
    alive = [node for node in nodes if node.get("Alive")]
    holding = [node for node in alive if _has(node, "CPU") >= cpus and _has(node, "GPU") >= gpus]
    if len(holding) >= nnodes:
        return
    need = _count(cpus, "CPU") + (f" and {_count(gpus, 'GPU')}" if gpus else "")
    has = "; ".join(
        f"{node.get('NodeManagerAddress', '?')} with {_count(_has(node, 'CPU'), 'CPU')}, "
        f"{_count(_has(node, 'GPU'), 'GPU')}"
        for node in alive
    )
    raise ValueError(
        f"{name}: verl.trainer.nnodes={nnodes} nodes of {_count(per_node, 'rank')} on {device} "
        f"({_count(groups, 'worker group')}) need {need} on each node; the cluster at {address} has "
        f"{_count(len(alive), 'live node')}: {has or 'none'}"
    )


def _count(number: float, thing: str) -> str:
    return f"{number:g} {thing}{'s' if number != 1 else ''}"


def _has(node: dict[str, Any], resource: str) -> float:
    return float(node.get("Resources", {}).get(resource, 0))


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of "host:port", "[v6]:port" or "ray://host:port"; None for anything else."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)
