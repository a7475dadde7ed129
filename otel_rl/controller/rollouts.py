"""What the rollout controllers run and report: rollouts, their groups, attempts and how an attempt ended."""

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any


class RolloutStatus(StrEnum):
    """How an attempt ended (the `otel_rl.rollout.status` attribute)."""

    OK = "ok"  # exit status 0
    ERROR = "error"  # non-zero exit status: the harness's own failure, not retried
    TIMEOUT = "timeout"  # ran past timeout_s; its process group was killed
    CRASHED = "crashed"  # killed by a signal the controller did not send
    INFRA_ERROR = "infra_error"  # could not be started (or was cancelled by the controller)
    # cut by the harness's own turn or context limit, as a launcher reads its exit: left out of training
    TRUNCATED = "truncated"


RETRIED = frozenset({RolloutStatus.TIMEOUT, RolloutStatus.CRASHED, RolloutStatus.INFRA_ERROR})


@dataclass(frozen=True)
class Rollout:
    """One rollout to run: a task (a JSON object), its GRPO group and its split."""

    rollout_id: str
    group_id: str
    task_id: str
    task: Mapping[str, Any]
    split: str = "train"


def new_id() -> str:
    """A fresh random id (32 lowercase hex) for rollouts, attempts and groups."""
    return uuid.uuid4().hex


def group_rollouts(
    task_id: str, task: Mapping[str, Any], n: int, *, group_id: str | None = None, split: str = "train"
) -> list[Rollout]:
    """n rollouts of the same task sharing one group id (a GRPO group), new unless given."""
    group_id = group_id or new_id()
    return [Rollout(new_id(), group_id, task_id, task, split) for _ in range(n)]


@dataclass(frozen=True)
class AttemptResult:
    """One attempt of a rollout, as recorded on its `otel_rl.rollout` span."""

    attempt_id: str
    status: RolloutStatus
    exit_code: int | None  # negative: killed by that signal number (Python's convention)
    trace_id: str
    start_time_unix_nano: int  # of its span
    duration_s: float
    log_path: Path


@dataclass(frozen=True)
class RolloutResult:
    """A rollout and all its attempts, in order; the last one is final."""

    rollout: Rollout
    attempts: tuple[AttemptResult, ...]

    @property
    def status(self) -> RolloutStatus:
        return self.attempts[-1].status
