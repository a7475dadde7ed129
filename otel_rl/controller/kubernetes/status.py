"""How an attempt ended, read from its Job's and Pods' status (pure: objects as the API returns them).

The harness's own ending is its container's: exit 0 is ok, another exit status an error, death by a
signal a crash, the Job's `DeadlineExceeded` a timeout. What stopped it from running at all, or killed it
from outside, is an infrastructure failure and retried as a new attempt: an image that cannot be pulled,
a pod that stays unschedulable, an eviction or preemption, an OOM kill, a lost node, a pod gone.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from otel_rl.controller.rollouts import RolloutStatus

# A container waiting for one of these will not start without someone changing something.
STUCK_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
NO_POD = "(no pod)"  # the reason's end for a failed Job without a pod that says why
# The pod was removed from under the harness (status.reason, or the DisruptionTarget condition's reason).
DISRUPTED = frozenset(
    {
        "Evicted",
        "NodeLost",
        "Shutdown",
        "Terminated",
        "UnexpectedAdmissionError",
        "EvictionByEvictionAPI",
        "PreemptionByScheduler",
        "DeletionByTaintManager",
        "DeletionByPodGC",
        "TerminationByKubelet",
    }
)


@dataclass(frozen=True)
class Ending:
    """The end of an attempt: its status, the harness's exit status when it had one, and why."""

    status: RolloutStatus
    exit_code: int | None
    reason: str

    @property
    def without_pod(self) -> bool:
        """A failed Job that no pod, as the caller saw them, explains."""
        return self.reason.endswith(NO_POD)


def ending(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, now: datetime, pending_timeout_s: float
) -> Ending | None:
    """The attempt's ending, or None while it is still running (or may yet run)."""
    for pod in pods:
        stuck = _stuck(pod, now, pending_timeout_s)
        if stuck is not None:
            return stuck
    condition = _finished_condition(job)
    if condition is None:
        for pod in pods:  # a pod failed, the Job controller has not said so yet
            if _phase(pod) == "Failed" and _disruption(pod) is not None:
                return Ending(RolloutStatus.INFRA_ERROR, None, _disruption(pod) or "")
        return None
    kind, reason = condition
    if kind == "Complete":
        return Ending(RolloutStatus.OK, 0, "Complete")
    if reason == "DeadlineExceeded":
        return Ending(RolloutStatus.TIMEOUT, _exit_code(pods), "DeadlineExceeded")
    for pod in pods:
        disruption = _disruption(pod)
        if disruption is not None:
            return Ending(RolloutStatus.INFRA_ERROR, None, disruption)
        terminated = _terminated_harness(pod)
        if terminated is not None:
            code = int(terminated.get("exitCode", 1))
            if terminated.get("reason") == "OOMKilled":
                return Ending(RolloutStatus.INFRA_ERROR, code, "OOMKilled")
            if terminated.get("signal") or code > 128:
                return Ending(RolloutStatus.CRASHED, code, terminated.get("reason") or "Signal")
            return Ending(RolloutStatus.ERROR, code, terminated.get("reason") or "Error")
    # Failed without a pod that says why: the pod was deleted or its node is gone.
    return Ending(RolloutStatus.INFRA_ERROR, None, f"{reason or 'Failed'} {NO_POD}")


def _finished_condition(job: Mapping[str, Any]) -> tuple[str, str] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return condition["type"], str(condition.get("reason") or "")
    return None


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _stuck(pod: Mapping[str, Any], now: datetime, pending_timeout_s: float) -> Ending | None:
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING:
            return Ending(
                RolloutStatus.INFRA_ERROR, None, f"{waiting['reason']}: {waiting.get('message', '')}"
            )
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            since = _time(condition.get("lastTransitionTime")) or now
            if (now - since).total_seconds() >= pending_timeout_s:
                return Ending(
                    RolloutStatus.INFRA_ERROR, None, f"Unschedulable: {condition.get('message', '')}"
                )
    return None


def _disruption(pod: Mapping[str, Any]) -> str | None:
    status = pod.get("status") or {}
    if status.get("reason") in DISRUPTED:
        return str(status["reason"])
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return str(condition.get("reason") or "DisruptionTarget")
    return None


def _terminated_harness(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    harness = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name")
    ordered = sorted(statuses, key=lambda s: s.get("name") != harness)  # the harness container first
    for container in ordered:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated and (terminated.get("exitCode") or terminated.get("reason") == "OOMKilled"):
            return terminated
    return None


def _exit_code(pods: Sequence[Mapping[str, Any]]) -> int | None:
    for pod in pods:
        terminated = _terminated_harness(pod)
        if terminated is not None:
            return int(terminated.get("exitCode", 1))
    return None


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
