"""Benchmark: the Kubernetes controller at 1,000 queued rollouts against the API stand-in (tests/kube_api.py).

Jobs created per second and the controller's CPU per attempt (its process's CPU: event loop, client,
span export, key requests), next to the floor: the official client's bare create-Job call rate against
the same stand-in (one call per Job, where an attempt costs the controller about six: create, Secret,
resume, record, Secret delete, Job delete). The stand-in runs in its own process, the otel-rl server
too, so that neither is counted as the controller's CPU.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, and this file would shadow the `kubernetes`
# package: take the folder off, put the tests' helpers on.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent / "tests"))
from kube_child import controller_for  # noqa: E402 - the tests' controller wiring
from otel_rl_server import ServerProcess  # noqa: E402 - the tests' real-server helper

from otel_rl.controller import Rollout, new_id  # noqa: E402

ROLLOUTS = 1000
FLOOR_CALLS = 1000
CONCURRENCY = 64  # of the bare create calls


def cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def process_cpu_s(pid: int) -> float:
    """User + system CPU of another process so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def controller_run(api_url: str, server: ServerProcess, log_dir: Path) -> tuple[float, float, int]:
    controller = controller_for(
        api_url,
        server.http_url,
        server.token,
        log_dir,
        jobs_per_second=1000,
        concurrency=ROLLOUTS,
        timeout_s=60,
        pending_timeout_s=600,
    )
    rollouts = [
        Rollout(new_id(), f"bench-{new_id()}", "t", {"behaviour": "ok", "question": "q"})
        for _ in range(ROLLOUTS)
    ]
    started, cpu = time.monotonic(), cpu_s()
    try:
        results = await asyncio.gather(*(controller.run_rollout(r) for r in rollouts))
        controller.flush()
    finally:
        await controller.aclose()
    wall, used = time.monotonic() - started, cpu_s() - cpu
    bad = [r.status for r in results if r.status.value != "ok"]
    assert not bad, f"{len(bad)} rollouts did not succeed: {bad[:5]}"
    return wall, used, controller.jobs_created


async def floor_rate(api_url: str) -> float:
    """Bare `create_namespaced_job` calls per second (CONCURRENCY in flight), the client's own cost only."""
    from kubernetes.aio import client

    api_client = client.ApiClient(client.Configuration(host=api_url))
    batch = client.BatchV1Api(api_client)
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"labels": {"otel-rl.dev/run": "floor"}},
        "spec": {
            "suspend": True,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i:ok"}]}},
        },
    }
    names = iter(range(FLOOR_CALLS))
    started = time.monotonic()

    async def worker() -> None:
        for number in names:
            manifest = {**body, "metadata": {**body["metadata"], "name": f"floor-{number}"}}
            await batch.create_namespaced_job("default", client.V1Job.from_dict(manifest))

    try:
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    finally:
        await api_client.close()
    return FLOOR_CALLS / (time.monotonic() - started)


def main() -> None:
    with tempfile.TemporaryDirectory() as workdir:
        server = ServerProcess(Path(workdir) / "bench.duckdb", Path(workdir)).start()
        stand_in = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve().parents[1] / "tests" / "kube_api.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert stand_in.stdout is not None
            api_url = stand_in.stdout.readline().strip()
            wall, cpu, created = asyncio.run(controller_run(api_url, server, Path(workdir) / "logs"))
            stand_in_cpu = process_cpu_s(stand_in.pid)
            floor = asyncio.run(floor_rate(api_url))
        finally:
            assert stand_in.stdin is not None
            stand_in.stdin.close()
            stand_in.wait(30)
            server.stop()
    print(
        f"controller: {ROLLOUTS} queued rollouts, {created} Jobs in {wall:.1f} s "
        f"= {created / wall:.0f} Jobs/s"
        f" (each attempt run to its end); CPU {cpu * 1000 / created:.1f} ms per attempt"
    )
    print(
        f"the stand-in's own CPU (API server and kubelet): {stand_in_cpu * 1000 / created:.1f} ms per attempt"
    )
    print(f"floor: the client's bare create-Job calls against the same stand-in: {floor:.0f} calls/s")


if __name__ == "__main__":
    main()
