"""The seam where an environment wraps each harness attempt of the local controller (a sandbox over a fresh
workspace, a grader after the episode: otel_rl/controller/coding.py), without a controller of its own."""

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    from otel_rl.controller.rollouts import Rollout, RolloutStatus


@dataclass
class Launch:
    """How one attempt's process starts: the argv and environment that replace the controller's, its
    working folder and the file descriptors it inherits; `attributes` go on the attempt's span."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None
    pass_fds: tuple[int, ...] = ()
    timeout_s: float | None = None  # a wall clock of its own: the lower of it and the controller's applies
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


class LaunchedAttempt(Protocol):
    """One attempt, prepared; `finish` runs once its process has exited, before its span ends, and returns
    the attempt's final status (an infrastructure failure found afterwards turns it into `infra_error`, an
    exit that says the harness hit its turn or context limit into `truncated`)."""

    launch: Launch

    async def finish(
        self, status: "RolloutStatus", returncode: int | None, span: Span
    ) -> "RolloutStatus": ...


class Launcher(Protocol):
    """Wraps each attempt. `env` is the contract's variables and the user's `env` setting only: nothing of
    the controller's own environment (which may hold the admin token) reaches a launcher."""

    def harness_task(self, rollout: "Rollout") -> Mapping[str, Any]:
        """The task the harness receives (OTEL_RL_TASK, `{task}`) in place of the rollout's own."""
        ...

    def attempt(
        self, rollout: "Rollout", identity: Mapping[str, str], argv: Sequence[str], env: Mapping[str, str]
    ) -> AbstractAsyncContextManager[LaunchedAttempt]: ...
