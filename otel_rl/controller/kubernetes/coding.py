"""A coding rollout on Kubernetes: the harness in the local backend's sandbox inside the Job's pod, the grader
on the controller's machine.

The Job's first container runs `python -m otel_rl.controller.kubernetes.pod` (pod.py) around the harness:
it unpacks the task's snapshot into a fresh one-commit repository, runs the harness there under bwrap with
the same namespaces, rlimits and wall clock as the local backend, beside the NetworkPolicy that limits the
pod to the server, then hands back the workspace's diff (log lines, checked by the sha256 in the container's
termination message). The snapshot travels in the attempt's Secret, mounted read-only; the pod holds
nothing of the grader's side: no hidden tests, gold patch or admin token in its spec, its environment or its
files. The grader runs here, outside the pod: the diff is applied to a pristine copy in a fresh local
sandbox, the hidden tests added, and the reward posted as source `grader` with the admin token, which never
leaves this process. Nothing the agent's process holds can write that source: at most it shapes its own
diff, which is what is graded anyway.
"""

import asyncio
import base64
import contextlib
import gzip
import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_rl import attributes as attr
from otel_rl.coding.grader import GradeResult, PatchError, grade
from otel_rl.coding.tasks import Task, TaskError
from otel_rl.coding.workspace import make_workspace
from otel_rl.controller.coding import (
    GRADED,
    CodingLauncher,
    grade_attributes,
    reward_body,
    sandbox_attributes,
    secrets_problem,
)
from otel_rl.controller.kubernetes import names
from otel_rl.controller.kubernetes.api import KubernetesApi
from otel_rl.controller.rollouts import Rollout, RolloutStatus

SNAPSHOT_KEY = "workspace.tar.gz"
MOUNT = "/var/run/otel-rl/attempt"  # the Secret's snapshot, read-only
REPORT = "/dev/termination-log"  # the container's terminationMessagePath: pod.py's report
MAX_SNAPSHOT_BYTES = 700 << 10  # a Secret holds 1 MiB, with the rollout key beside it
REPORT_GRACE_S = 60.0  # the Job's deadline past the sandbox's wall clock: unpacking, the diff, the report
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on its pods
MAX_DIFF_LOG_BYTES = 24 << 20  # the diff's lines at the log's end (pod.py: at most 16 MiB of base64)


class SnapshotTooLarge(ValueError):
    """A task's repository too large to travel in a Secret."""


def pod_security(job: dict[str, Any]) -> None:
    """What bwrap needs in a pod, forced on the rendered Job (docs/kubernetes.md, "Coding rollouts"): a
    user namespace of the pod's own (`hostUsers: false`, which makes `procMount: Unmasked` allowed: bwrap
    mounts a fresh /proc, which the kernel refuses over the runtime's masked one), seccomp and AppArmor
    unconfined (the runtimes' default profiles refuse unshare and mount), a non-root user with no
    capabilities and no privilege escalation (bwrap builds its namespaces unprivileged), no service account
    token and no service variables."""
    pod = job["spec"]["template"]["spec"]
    pod.update(hostUsers=False, automountServiceAccountToken=False, enableServiceLinks=False)
    harness = pod["containers"][0]
    context = harness.setdefault("securityContext", {})
    context.update(
        runAsNonRoot=True,
        allowPrivilegeEscalation=False,
        privileged=False,
        capabilities={"drop": ["ALL"]},
        procMount="Unmasked",
        seccompProfile={"type": "Unconfined"},
        appArmorProfile={"type": "Unconfined"},
    )
    for key in ("runAsUser", "runAsGroup"):  # the template's own user wins (the pod's or the container's)
        if key not in context and key not in (pod.get("securityContext") or {}):
            context[key] = 1000


class KubernetesCoding:
    """The coding side of the Kubernetes controller, around one CodingLauncher (its tasks, limits, mode,
    binds, grader settings and reward poster)."""

    def __init__(self, launcher: CodingLauncher, *, admin_token: str, python: str = "python3") -> None:
        self.launcher = launcher
        self.python = python  # the pod image's interpreter, with otel-rl installed
        self._admin_token = admin_token  # only to check that no Job carries it
        self._snapshots: dict[str, bytes] = {}  # by instance id: tasks do not change during a run

    def harness_task(self, rollout: Rollout) -> dict[str, Any]:
        return self.launcher.harness_task(rollout)

    def timeout_s(self, controller_timeout_s: float) -> float:
        return min(controller_timeout_s, self.launcher.limits.wall_seconds + REPORT_GRACE_S)

    def snapshot(self, instance_id: str) -> bytes:
        """The task's repository at its base commit as a gzipped tar, without `.git`."""
        if instance_id in self._snapshots:
            return self._snapshots[instance_id]
        task = self.launcher.task_set.get(instance_id)
        buffer = io.BytesIO()
        with tempfile.TemporaryDirectory(prefix="otel-rl-snapshot-") as scratch:
            make_workspace(self.launcher.task_set, task, Path(scratch))
            with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
                for entry in sorted(Path(scratch).iterdir()):
                    if entry.name != ".git":
                        tar.add(entry, arcname=entry.name)
        if buffer.tell() > MAX_SNAPSHOT_BYTES:
            raise SnapshotTooLarge(
                f"task {instance_id}: its repository is {buffer.tell()} bytes gzipped, over the "
                f"{MAX_SNAPSHOT_BYTES} a Secret carries to the pod"
            )
        self._snapshots[instance_id] = buffer.getvalue()
        return self._snapshots[instance_id]

    def wrap(self, job: dict[str, Any], rollout: Rollout, secret: str) -> None:
        """Wrap the rendered Job's harness in pod.py's sandbox, mount the snapshot, set what bwrap needs; a
        Job that would hand the pod anything of the grader's side is refused."""
        task = self.launcher.task_of(rollout)
        self.snapshot(task.instance_id)  # too large: refused before any Job exists
        pod = job["spec"]["template"]["spec"]
        harness = pod["containers"][0]
        limits = self.launcher.limits.model_dump_json()
        binds = [arg for bind in self.launcher.binds for arg in ("--bind", bind.inside)]
        harness["command"] = [
            self.python, "-m", "otel_rl.controller.kubernetes.pod", "--snapshot", f"{MOUNT}/{SNAPSHOT_KEY}",
            "--report", REPORT, "--limits", limits, "--mode", self.launcher.mode, *binds,
            "--", *harness["command"],
        ]  # fmt: skip
        harness["terminationMessagePath"] = REPORT
        harness["terminationMessagePolicy"] = "File"
        volume = "otel-rl-snapshot"
        items = [{"key": SNAPSHOT_KEY, "path": SNAPSHOT_KEY}]
        pod["volumes"] = [
            *(pod.get("volumes") or []),
            {"name": volume, "secret": {"secretName": secret, "items": items, "defaultMode": 0o444}},
        ]
        harness["volumeMounts"] = [
            *(harness.get("volumeMounts") or []),
            {"name": volume, "mountPath": MOUNT, "readOnly": True},
        ]
        pod_security(job)
        problem = secrets_problem(task, list(_strings(job)), self._admin_token)
        if problem is not None:
            raise ValueError(f"rollout {rollout.rollout_id}: its Job would hand the pod {problem}")

    def secret_data(self, rollout: Rollout) -> dict[str, str]:
        """The attempt's Secret's binary part: the snapshot (base64, as the API's `data` holds it)."""
        snapshot = self.snapshot(self.launcher.task_of(rollout).instance_id)
        return {SNAPSHOT_KEY: base64.b64encode(snapshot).decode()}

    def attributes(self, rollout: Rollout) -> dict[str, Any]:
        """The controller's rollout span's: the sandbox's mode and limits, the task (as locally)."""
        instance = self.launcher.task_of(rollout).instance_id
        return {
            **sandbox_attributes(self.launcher.limits, self.launcher.mode),
            attr.CODING_INSTANCE: instance,
        }

    async def finish(
        self,
        rollout: Rollout,
        status: RolloutStatus,
        exit_code: int | None,
        api: KubernetesApi,
        pods: list[dict[str, Any]],
        span_attributes: dict[str, Any],
    ) -> RolloutStatus:
        """The attempt's final status, after grading its diff when its episode ended; what the grader found
        goes into span_attributes (as CodingAttempt.finish does locally). `pods` are the watch's; when they
        hold no report yet (the Job's event came first), the API is asked."""
        report = _report(pods)
        job = (pods[0]["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) if pods else None
        if report is None and job and status is not RolloutStatus.INFRA_ERROR:
            with contextlib.suppress(Exception):  # the API unreachable: the watch's copies are all there is
                pods = (await api.list_pods(names.selector({JOB_NAME_LABEL: job})))[0] or pods
            report = _report(pods)
        not_graded = {attr.GRADE_OUTCOME: "not_graded"}
        if report is not None and not report.get("started"):
            error = "the sandbox did not start (bwrap's error is in the log)"
            span_attributes |= not_graded | {attr.GRADE_ERROR: error}
            return RolloutStatus.INFRA_ERROR
        if status is RolloutStatus.TIMEOUT or (report or {}).get("timed_out"):
            span_attributes |= not_graded | {attr.ROLLOUT_TRUNCATED: "time"}
            return RolloutStatus.TIMEOUT
        if status is RolloutStatus.ERROR and exit_code in self.launcher.truncated_exit_codes:
            span_attributes |= not_graded | {attr.ROLLOUT_TRUNCATED: "harness_limit"}
            return RolloutStatus.TRUNCATED
        if status not in GRADED:  # cut short or crashed: not the agent's finished work, never a 0
            span_attributes |= not_graded
            return status
        task = self.launcher.task_of(rollout)
        try:
            patch = await _diff(report, lambda lines: api.pod_log(pods, MAX_DIFF_LOG_BYTES, tail_lines=lines))
        except Exception as error:  # no report, an unreadable log, a diff that did not come back whole
            result = _infrastructure(task, f"the pod's diff: {error}")
        else:
            result = await asyncio.to_thread(self._grade, task, patch)
        span_attributes |= grade_attributes(result)
        if result.reward is None:
            return RolloutStatus.INFRA_ERROR  # counted apart (and retried), never a reward
        try:
            await asyncio.to_thread(self.launcher.post_reward, reward_body(rollout, result))
        except Exception as error:  # the reward did not land: the attempt is the infrastructure's failure
            span_attributes[attr.GRADE_ERROR] = f"posting the reward: {error}"[:1000]
            return RolloutStatus.INFRA_ERROR
        return status

    def _grade(self, task: Task, patch: str) -> GradeResult:
        launcher = self.launcher
        try:
            return grade(
                launcher.task_set, task, patch, limits=launcher.grader_limits, mode=launcher.mode,
                test_timeout_s=launcher.test_timeout_s,
            )  # fmt: skip
        except (TaskError, PatchError, OSError) as error:
            return _infrastructure(task, f"{type(error).__name__}: {error}")


def _strings(node: Any) -> Iterator[str]:
    """Every key and text value of a manifest."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def _report(pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """pod.py's report from the last pod's harness container's termination message, or None."""
    if not pods:
        return None
    pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
    harness = pod["spec"]["containers"][0]["name"]
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if status.get("name") == harness and terminated.get("message"):
            try:
                report = json.loads(terminated["message"])
            except ValueError:
                return None
            return report if isinstance(report, dict) else None
    return None


async def _diff(report: dict[str, Any] | None, tail: Callable[[int], Awaitable[str]]) -> str:
    if report is None:
        raise ValueError("the pod left no report (its termination message)")
    if report.get("diff_error"):
        raise ValueError(str(report["diff_error"]))
    lines = int(report["diff_lines"])
    text = await tail(lines)
    patch = gzip.decompress(base64.b64decode("".join(text.split()[-lines:])))
    if hashlib.sha256(patch).hexdigest() != report["diff_sha256"]:
        raise ValueError("its sha256 does not match the report's")
    return patch.decode(errors="surrogateescape")


def _infrastructure(task: Task, error: str) -> GradeResult:
    return GradeResult(
        instance_id=task.instance_id, outcome="infrastructure_error", reward=None,
        tests={test: "missing" for test in task.expected_tests}, dropped_paths=[], error=error, seconds=0.0,
    )  # fmt: skip
