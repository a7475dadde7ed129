"""What a restarted controller takes back: the rollouts whose Jobs a killed controller left unfinished.

A rollout is unfinished when the Job of its last attempt has no recorded result (it runs, or ended unseen),
or a result that is retried (an infrastructure failure, a timeout) with attempts left. `run_rollout` of
such a rollout reads its recorded attempts back, watches a running Job on and starts the next attempt only
where none exists. A rollout whose last result is final was returned already, or its controller died
before deleting its Jobs: its spans are in the store, and there is nothing to adopt.

Everything comes from the Jobs themselves: identity from the controller's annotations, the task from the
harness container's OTEL_RL_TASK (the same JSON the harness reads), the attempt number from its label.
"""

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from otel_rl.controller.kubernetes import names
from otel_rl.controller.rollouts import RETRIED, Rollout, RolloutStatus

log = logging.getLogger(__name__)


class _NotARollout(ValueError):
    """A Job with the run's label that the controller cannot read a rollout from."""


def unfinished_rollouts(jobs: Iterable[Mapping[str, Any]], max_attempts: int) -> list[Rollout]:
    """The rollouts of `jobs` (one run's) that are not final, in the order their last attempts started."""
    latest: dict[str, tuple[int, int, Mapping[str, Any]]] = {}  # rollout id -> (attempt, started_ns, Job)
    for job in jobs:
        try:
            rollout_id, number, started_ns = _identity(job)
        except _NotARollout as error:
            log.warning("Job %s: %s; not adopted", _name(job), error)
            continue
        if rollout_id not in latest or number > latest[rollout_id][0]:
            latest[rollout_id] = (number, started_ns, job)
    found: list[tuple[int, Rollout]] = []
    for number, started_ns, job in latest.values():
        try:
            if _final(job, number, max_attempts):
                continue
            found.append((started_ns, _rollout(job)))
        except _NotARollout as error:
            log.warning("Job %s: %s; not adopted", _name(job), error)
    return [rollout for _, rollout in sorted(found, key=lambda item: item[0])]


def _identity(job: Mapping[str, Any]) -> tuple[str, int, int]:
    annotations = _annotations(job)
    labels = (job.get("metadata") or {}).get("labels") or {}
    try:
        return annotations[names.ROLLOUT_ID], int(labels[names.ATTEMPT]), int(annotations[names.STARTED_NS])
    except (KeyError, ValueError, TypeError) as error:
        raise _NotARollout(f"no rollout id, attempt number or start time ({error!r})") from None


def _final(job: Mapping[str, Any], number: int, max_attempts: int) -> bool:
    recorded = _annotations(job).get(names.RESULT)
    if recorded is None:
        return False
    try:
        status = RolloutStatus(json.loads(recorded)["status"])
    except (ValueError, KeyError, TypeError) as error:
        raise _NotARollout(f"its {names.RESULT} annotation is not a result ({error!r})") from None
    return status not in RETRIED or number >= max_attempts


def _rollout(job: Mapping[str, Any]) -> Rollout:
    annotations = _annotations(job)
    try:
        harness = job["spec"]["template"]["spec"]["containers"][0]
        [task_json] = [e.get("value") for e in harness.get("env") or [] if e.get("name") == "OTEL_RL_TASK"]
        task = json.loads(task_json)
        if not isinstance(task, dict):
            raise TypeError(f"OTEL_RL_TASK holds a {type(task).__name__}, not an object")
        return Rollout(
            annotations[names.ROLLOUT_ID],
            annotations[names.GROUP_ID],
            annotations[names.TASK_ID],
            task,
            annotations[names.SPLIT],
        )
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as error:
        raise _NotARollout(f"no group, task or split to adopt its rollout by ({error!r})") from None


def _annotations(job: Mapping[str, Any]) -> dict[str, str]:
    return (job.get("metadata") or {}).get("annotations") or {}


def _name(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("name"))
