"""A coding rollout under the local controller: each attempt's harness runs in a bubblewrap sandbox over a
fresh workspace with only the gateway and OTLP ports forwarded in; afterwards the grader, outside it, grades
the workspace's diff and the controller posts the reward as source `grader` with the admin credential."""

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.trace import Span

from otel_rl import attributes as attr
from otel_rl.auth import TOKEN_FILE
from otel_rl.coding import sandbox
from otel_rl.coding.forward import Network, network
from otel_rl.coding.grader import TEST_TIMEOUT_S, GradeResult, PatchError, grade
from otel_rl.coding.settings import CodingSection
from otel_rl.coding.tasks import Task, TaskError, TaskSet, load_tasks
from otel_rl.coding.workspace import make_workspace, workspace_diff
from otel_rl.controller.launcher import Launch
from otel_rl.controller.rollouts import Rollout, RolloutStatus

# The URLs the harness reaches its server by: each must be a loopback port, forwarded into the sandbox.
FORWARDED_URLS = ("OPENAI_BASE_URL", "OTEL_EXPORTER_OTLP_ENDPOINT")
LOOPBACK_HOSTS = {"127.0.0.1", "localhost"}
GRADED = frozenset({RolloutStatus.OK, RolloutStatus.ERROR})  # the agent's episode ended: its diff counts
AGENT_LIMITS = sandbox.Limits()
GRADER_LIMITS = sandbox.Limits(wall_seconds=900.0)  # as `otel-rl grade`
RewardPoster = Callable[[Mapping[str, Any]], None]  # a POST /v1/rewards body, sent with the admin token


def agent_task(task: Task) -> dict[str, str]:
    """What a harness may know of a task (OTEL_RL_TASK, `{task}`): never the hidden tests, the gold patch or
    the expected test ids."""
    return {"instance_id": task.instance_id, "repo": task.repo, "problem_statement": task.problem_statement}


def sandbox_attributes(limits: sandbox.Limits, mode: sandbox.Mode) -> dict[str, str | int | float]:
    """The sandbox's mode and limits as attributes (`otel_rl.sandbox.*`)."""
    return {attr.SANDBOX_MODE: mode} | {attr.SANDBOX_LIMITS + k: v for k, v in limits.model_dump().items()}


def loopback_ports(env: Mapping[str, str]) -> tuple[int, ...]:
    """The ports of the server URLs the harness is given; ValueError for one the sandbox cannot reach."""
    ports: list[int] = []
    for name in FORWARDED_URLS:
        url = urlsplit(env[name])
        if url.hostname not in LOOPBACK_HOSTS or url.port is None:
            raise ValueError(
                f"{name}={env[name]!r}: a sandboxed harness reaches only loopback ports of this machine "
                "(give the server as http://127.0.0.1:PORT)"
            )
        ports.append(url.port)
    return tuple(dict.fromkeys(ports))


def inside_environment(env: Mapping[str, str], limits: sandbox.Limits, mode: sandbox.Mode) -> dict[str, str]:
    """The harness's environment inside: the controller's (contract + user settings), URLs on 127.0.0.1
    (the same ports, forwarded), the sandbox's attributes added to its resource attributes."""
    inside = dict(env)
    for name in FORWARDED_URLS:
        inside[name] = inside[name].replace("//localhost:", "//127.0.0.1:", 1)
    extra = ",".join(f"{key}={value}" for key, value in sandbox_attributes(limits, mode).items())
    inside["OTEL_RESOURCE_ATTRIBUTES"] = f"{inside['OTEL_RESOURCE_ATTRIBUTES']},{extra}"
    return inside


def secrets_problem(task: Task, texts: Sequence[str], admin_token: str) -> str | None:
    """What of the grader's side a harness would be handed (its argv and environment), or None."""
    hidden = {
        "the admin token": admin_token,
        "the hidden tests": task.test_patch,
        "the gold patch": task.patch,
    }
    for what, secret in hidden.items():
        if secret.strip() and any(secret.strip() in text for text in texts):
            return what
    return None


@dataclass
class CodingAttempt:
    """One prepared attempt: its sandboxed launch, and the grading once it has ended."""

    launch: Launch
    launcher: "CodingLauncher"
    task: Task
    rollout: Rollout
    workspace: Path
    gate: int | None  # None: unsandboxed, no bwrap to fail before the command
    network: Network | None = None  # the sandbox's network: what it denied

    async def finish(self, status: RolloutStatus, returncode: int | None, span: Span) -> RolloutStatus:
        if self.network is not None:
            await asyncio.to_thread(self.network.settle)
            record_denied(span, self.network)
        if self.gate is not None and not sandbox.command_started(self.gate):
            span.set_attribute(attr.GRADE_OUTCOME, "not_graded")
            span.set_attribute(attr.GRADE_ERROR, "the sandbox did not start (bwrap's error is in the log)")
            return RolloutStatus.INFRA_ERROR
        if status is RolloutStatus.TIMEOUT:
            span.set_attribute(attr.ROLLOUT_TRUNCATED, "time")
        if status is RolloutStatus.ERROR and returncode in self.launcher.truncated_exit_codes:
            span.set_attribute(attr.ROLLOUT_TRUNCATED, "harness_limit")
            span.set_attribute(attr.GRADE_OUTCOME, "not_graded")
            return RolloutStatus.TRUNCATED
        if status not in GRADED:  # cut short or crashed: not the agent's finished work, never a 0
            span.set_attribute(attr.GRADE_OUTCOME, "not_graded")
            return status
        result = await asyncio.to_thread(self.launcher.grade_workspace, self.task, self.workspace)
        span.set_attributes(grade_attributes(result))
        if result.reward is None:
            return RolloutStatus.INFRA_ERROR  # counted apart (and retried), never a reward
        try:
            await asyncio.to_thread(self.launcher.post_reward, reward_body(self.rollout, result))
        except Exception as error:  # the reward did not land: the attempt is the infrastructure's failure
            span.set_attribute(attr.GRADE_ERROR, f"posting the reward: {error}"[:1000])
            return RolloutStatus.INFRA_ERROR
        return status


def record_denied(span: Span, net: Network) -> None:
    """What the sandbox's network denied, on the controller's rollout span (a sender the server vouches
    for, never the agent's process): the count, and one event per recorded attempt."""
    span.set_attribute(attr.SANDBOX_DENIED_CONNECTS, net.count)
    for denied in net.denied:
        attributes: dict[str, str | int] = {
            "network.transport": "udp" if denied.protocol == "dns" else "tcp",
            "server.port": denied.port,
        }
        if denied.address:
            attributes["server.address"] = denied.address
        if denied.name:
            attributes["dns.question.name"] = denied.name
        span.add_event(attr.SANDBOX_DENIED_EVENT, attributes, timestamp=denied.time_unix_nano)


def grade_attributes(result: GradeResult) -> dict[str, Any]:
    """The grader's verdict as attributes of the controller's rollout span."""
    attributes: dict[str, Any] = {
        attr.GRADE_OUTCOME: result.outcome,
        attr.GRADE_TESTS_PASSED: sum(status == "passed" for status in result.tests.values()),
        attr.GRADE_TESTS_TOTAL: len(result.tests),
        attr.GRADE_DROPPED_PATHS: result.dropped_paths,
    }
    if result.reward is not None:
        attributes[attr.GRADE_REWARD] = result.reward
    if result.error is not None:
        attributes[attr.GRADE_ERROR] = result.error[:1000]
    return attributes


def reward_body(rollout: Rollout, result: GradeResult) -> dict[str, Any]:
    """The POST /v1/rewards body: `outcome` from source `grader`; per-test results and dropped paths in the
    explanation (JSON), with the test files that did not import (`collection_errors`) when some did not."""
    details: dict[str, Any] = {"tests": result.tests, "dropped_paths": result.dropped_paths}
    if result.collection_errors:
        details["collection_errors"] = result.collection_errors
    explanation = json.dumps(details)
    return {
        "rollout_id": rollout.rollout_id,
        "name": "outcome",
        "value": float(result.reward or 0),
        "source": attr.REWARD_SOURCE_GRADER,
        "label": "pass" if result.reward else "fail",
        "explanation": explanation[:60_000],
    }


class CodingLauncher:
    """The controller's launcher (otel_rl/controller/launcher.py) for coding tasks. `binds`: read-only host
    folders the harness itself needs (its script, a CLI's install), seen inside at the same path;
    `truncated_exit_codes`: the harness's exit statuses that mean its episode was cut by a turn or context
    limit (status `truncated`: not graded, left out of training)."""

    def __init__(
        self,
        task_set: TaskSet,
        *,
        admin_token: str,
        post_reward: RewardPoster,
        limits: sandbox.Limits = AGENT_LIMITS,
        grader_limits: sandbox.Limits = GRADER_LIMITS,
        binds: Sequence[Path] = (),
        truncated_exit_codes: Sequence[int] = (),
        mode: sandbox.Mode = "bubblewrap",
        test_timeout_s: float = TEST_TIMEOUT_S,
    ) -> None:
        if mode == "bubblewrap":
            sandbox.probe_user_namespaces()  # no sandbox here: stop now, saying what to enable
        self.mode = mode
        self.task_set = task_set
        self.limits = limits
        self.grader_limits = grader_limits
        self.test_timeout_s = test_timeout_s  # the grader's per-test timeout
        self._admin_token = admin_token
        self.post_reward = post_reward
        # the harness's exits that say its CLI stopped at its own turn or context limit
        self.truncated_exit_codes = frozenset(truncated_exit_codes)
        self.binds = tuple(sandbox.Bind(path.resolve(), str(path.resolve())) for path in binds)
        exposed = [task_set.path.resolve(), TOKEN_FILE.resolve()]
        for bind in self.binds:
            for secret in exposed:
                if secret.is_relative_to(bind.host):
                    raise ValueError(f"bind {bind.host} would show {secret} inside the sandbox")

    def task_of(self, rollout: Rollout) -> Task:
        """The rollout's task: its task's `instance_id`, else its task id (a training task file's `id`)."""
        instance = rollout.task.get("instance_id", rollout.task_id)
        if not isinstance(instance, str):
            raise TaskError(f"rollout {rollout.rollout_id}: its task's instance_id is not text")
        return self.task_set.get(instance)

    def harness_task(self, rollout: Rollout) -> dict[str, Any]:
        """The rollout's task with the coding task's agent-side fields (`agent_task`) over it; a task that
        holds the grader's fields is refused."""
        if {"patch", "test_patch"} & set(rollout.task):
            raise ValueError(f"rollout {rollout.rollout_id}: its task holds grader-side fields")
        return {**rollout.task, **agent_task(self.task_of(rollout))}

    @asynccontextmanager
    async def attempt(
        self, rollout: Rollout, identity: Mapping[str, str], argv: Sequence[str], env: Mapping[str, str]
    ) -> AsyncIterator[CodingAttempt]:
        task = self.task_of(rollout)
        ports = loopback_ports(env)
        inside = inside_environment(env, self.limits, self.mode)
        attributes = {**sandbox_attributes(self.limits, self.mode), attr.CODING_INSTANCE: task.instance_id}
        problem = secrets_problem(task, [*argv, *inside.keys(), *inside.values()], self._admin_token)
        if problem is not None:
            raise ValueError(f"rollout {rollout.rollout_id}: the harness would be handed {problem}")
        with tempfile.TemporaryDirectory(prefix="otel-rl-rollout-") as scratch:
            workspace = Path(scratch, "workspace")
            workspace.mkdir()
            await asyncio.to_thread(make_workspace, self.task_set, task, workspace)
            if self.mode == "unsandboxed":  # asked for by name: rlimits and the wall clock only
                command = [*sandbox.limits_prefix(self.limits), *argv]
                plain = sandbox.plain_environment(inside)
                wall = self.limits.wall_seconds
                launch = Launch(command, plain, cwd=workspace, timeout_s=wall, attributes=attributes)
                yield CodingAttempt(launch, self, task, rollout, workspace, None)
                return
            await asyncio.to_thread(sandbox.hand_over, workspace)
            with network(list(ports), python=sys.executable) as net:
                wall = sandbox.bwrap_argv(
                    workspace,
                    list(argv),
                    limits=self.limits,
                    binds=self.binds,
                    env=inside,
                    shared_network=True,
                )
                command, gate = sandbox.gated(wall)
                try:
                    launch = Launch(
                        [*net.prefix, *command],
                        {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},  # bwrap's own: it clears the rest
                        pass_fds=(gate,),
                        timeout_s=self.limits.wall_seconds,
                        attributes=attributes,
                    )
                    yield CodingAttempt(launch, self, task, rollout, workspace, gate, net)
                finally:
                    os.close(gate)

    def grade_workspace(self, task: Task, workspace: Path) -> GradeResult:
        """Grade what the agent left, outside its sandbox; a failure of ours is an infrastructure error."""
        try:
            patch = workspace_diff(self.task_set, task, workspace)
            return grade(
                self.task_set, task, patch, limits=self.grader_limits, mode=self.mode,
                test_timeout_s=self.test_timeout_s,
            )  # fmt: skip
        except (TaskError, PatchError, OSError) as error:
            return GradeResult(
                instance_id=task.instance_id, outcome="infrastructure_error", reward=None,
                tests={test: "missing" for test in task.expected_tests}, dropped_paths=[],
                error=f"{type(error).__name__}: {error}", seconds=0.0,
            )  # fmt: skip


def coding_launcher(section: CodingSection, *, admin_token: str, post_reward: RewardPoster) -> CodingLauncher:
    """The controller's launcher for a `controller.coding` section; SandboxError where the sandbox cannot
    start here."""
    limits = sandbox.Limits(
        cpu_seconds=section.cpu_seconds, memory_bytes=section.memory_bytes, processes=section.processes,
        file_bytes=section.file_bytes, wall_seconds=section.wall_seconds,
    )  # fmt: skip
    grader = sandbox.Limits(cpu_seconds=section.grader_cpu_seconds, wall_seconds=section.grader_wall_seconds)
    return CodingLauncher(
        load_tasks(section.tasks), admin_token=admin_token, post_reward=post_reward, limits=limits,
        grader_limits=grader, binds=section.binds, truncated_exit_codes=section.truncated_exit_codes,
        mode=section.mode, test_timeout_s=section.grader_test_timeout_seconds,
    )  # fmt: skip
