"""Difficulty probes: k rollouts a task with the current policy through the coding rollout path (sandbox,
gateway, the grader posting `grader` rewards), grouped by probe run so that curation reads one run."""

import asyncio
import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from otel_rl.coding.tasks import Task
from otel_rl.controller.rollouts import Rollout, RolloutResult
from otel_rl.input_rules import check_id

if TYPE_CHECKING:
    from otel_rl.controller.backends import RolloutRunner

PROBE_SPLIT = "val"  # a probe is never trained on (otel_rl.split takes train or val)
MAX_K = 64


def probe_group_id(probe_id: str, task: Task) -> str:
    """The group of a task's probes in one probe run: `<probe_id>-<16 hex of its instance_id>`."""
    return f"{probe_id}-{hashlib.sha256(task.instance_id.encode()).hexdigest()[:16]}"


def probe_rollouts(tasks: Sequence[Task], k: int, probe_id: str) -> list[Rollout]:
    """k rollouts a task, one group a task, split `val`, task id the task's instance_id; the rollout ids
    are fixed by probe run, task and sample (the same run again adopts nothing twice). The task a harness
    gets is the coding launcher's (`agent_task`): nothing of the grader's side is in it."""
    if not 1 <= k <= MAX_K:
        raise ValueError(f"--k {k}: between 1 and {MAX_K}")
    rollouts = []
    for task in tasks:
        group_id = probe_group_id(probe_id, task)
        check_id(group_id, "the probe's group id (made of --probe-id)")
        check_id(task.instance_id, f"task {task.instance_id!r}: its instance_id as otel_rl.task.id")
        for sample in range(k):
            rollout_id = hashlib.sha256(f"{group_id}\0{sample}".encode()).hexdigest()[:32]
            payload = {"instance_id": task.instance_id}
            rollouts.append(Rollout(rollout_id, group_id, task.instance_id, payload, PROBE_SPLIT))
    return rollouts


def probe_summary(results: Sequence[RolloutResult]) -> list[dict[str, Any]]:
    """One record a task: its probes' statuses (`ok` graded, `infra_error` never a reward, ...)."""
    by_task: dict[str, Counter[str]] = {}
    for result in results:
        by_task.setdefault(result.rollout.task_id, Counter())[result.status.value] += 1
    return [
        {"instance_id": task_id, "rollouts": sum(counts.values()), "statuses": dict(sorted(counts.items()))}
        for task_id, counts in by_task.items()
    ]


async def run_probes(runner: "RolloutRunner", rollouts: Sequence[Rollout]) -> list[RolloutResult]:
    """Every probe on `runner` at once (the controller's concurrency bounds how many run)."""
    return list(await asyncio.gather(*(runner.run_rollout(rollout) for rollout in rollouts)))
