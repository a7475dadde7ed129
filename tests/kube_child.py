"""The Kubernetes controller as the tests build it, and in its own process for the test that kills it.

As a script (argv: the stand-in's URL, a JSON file of rollouts, the otel-rl server's URL, its token, the
log folder) it runs the rollouts to their end, unless it is killed first.
"""

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from otel_rl.controller import ControllerSettings, Rollout
from otel_rl.controller.kubernetes.api import KubernetesApi
from otel_rl.controller.kubernetes.coding import KubernetesCoding
from otel_rl.controller.kubernetes.controller import KubernetesController
from otel_rl.controller.kubernetes.settings import KubernetesSettings
from otel_rl.train.server_client import ServerClient

TEMPLATE = Path(__file__).parent / "kube_job.yaml"
RUN_ID = "run-k8s-test"
POD_SERVER_URL = "http://otel-rl.otel-rl.svc:4318"  # what pods are told; the controller exports spans itself


def leave_jobs_behind(stand: Any, server: Any, work: Path, rollouts: list[Rollout], running: int) -> None:
    """Run `rollouts` in a controller process (this file) SIGKILLed once `running` pods run on `stand`."""
    listed = [
        {"rollout_id": r.rollout_id, "group_id": r.group_id, "task_id": r.task_id, "task": r.task}
        for r in rollouts
    ]
    (work / "rollouts.json").write_text(json.dumps(listed))
    script = [sys.executable, __file__, stand.url, str(work / "rollouts.json"), server.http_url, server.token]
    child = subprocess.Popen([*script, str(work / "logs")])
    try:
        deadline = time.monotonic() + 30
        while sum(p["status"].get("phase") == "Running" for p in stand.call(stand.of_kind, "Pod")) < running:
            assert time.monotonic() < deadline and child.poll() is None, (
                "the child never got its pods running"
            )
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def controller_for(
    api_url: str,
    server_url: str,
    token: str,
    log_dir: Path,
    coding: KubernetesCoding | None = None,
    pod_server_url: str = POD_SERVER_URL,
    **settings: Any,
) -> KubernetesController:
    """The controller the tests run; `coding` and `pod_server_url` for coding rollouts
    (test_controller_kubernetes_coding.py), `settings` override ControllerSettings' and the cluster's."""
    kube = KubernetesSettings(
        template=TEMPLATE,
        namespace="default",
        server_url=pod_server_url,
        relist_s=settings.pop("relist_s", 30),
        pending_timeout_s=settings.pop("pending_timeout_s", 0.5),
        jobs_per_second=settings.pop("jobs_per_second", 200),
        burst=20,
    )
    rollouts = ControllerSettings(
        command=settings.pop("command", ["python", "-m", "harness", "{task}"]),
        timeout_s=settings.pop("timeout_s", 3),
        max_attempts=settings.pop("max_attempts", 2),
        log_dir=log_dir,
        env=settings.pop("env", {"HARNESS_LEVEL": "debug"}),
        **settings,
    )
    api = KubernetesApi(client.ApiClient(client.Configuration(host=api_url)), "default")
    issuer = ServerClient(server_url, token)
    return KubernetesController(
        rollouts,
        kube,
        otlp_endpoint=server_url,
        openai_base_url=f"{server_url}/v1",
        token=token,
        issue_key=issuer.issue_rollout_key,
        revoke_key=issuer.revoke_rollout_key,
        run_id=RUN_ID,
        api=api,
        coding=coding,
    )


def rollout_from_json(data: dict[str, Any]) -> Rollout:
    return Rollout(data["rollout_id"], data["group_id"], data["task_id"], data["task"])


async def main(api_url: str, rollouts: Path, server_url: str, token: str, log_dir: Path) -> None:
    controller = controller_for(api_url, server_url, token, log_dir)
    try:
        listed = json.loads(rollouts.read_text())
        await asyncio.gather(*(controller.run_rollout(rollout_from_json(r)) for r in listed))
    finally:
        await controller.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5])))
