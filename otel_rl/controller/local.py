"""Local rollout controller: each rollout attempt is a harness process in its own process group."""

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode
from pydantic import BaseModel, ConfigDict, Field, model_validator

from otel_rl import attributes as attr
from otel_rl.controller import defaults
from otel_rl.controller.environment import HarnessEnv, base_environment, harness_argv, harness_environment
from otel_rl.controller.forkserver import Forked, ForkServer, python_target
from otel_rl.controller.launcher import Launcher
from otel_rl.controller.rollouts import (
    RETRIED,
    AttemptResult,
    Rollout,
    RolloutResult,
    RolloutStatus,
    new_id,
)

log = logging.getLogger(__name__)


class ControllerSettings(BaseModel):
    """How harnesses are run: command, limits, retries (a training config's `online` section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # a string runs through /bin/sh -c; `{task}` is replaced by the task JSON
    command: str | list[str]
    concurrency: int = Field(defaults.CONCURRENCY, ge=1)
    timeout_s: float = Field(defaults.TIMEOUT_S, gt=0)
    # attempts per rollout, counting retries of timeouts, crashes and infra errors
    max_attempts: int = Field(defaults.MAX_ATTEMPTS, ge=1)
    kill_grace_s: float = 5.0  # SIGTERM → SIGKILL delay when a timeout kills the process group
    log_dir: Path = Path(".otel_rl/rollouts")
    env: HarnessEnv = {}  # extra variables for every harness
    # Python harnesses only: modules a fork server imports once; each attempt is then forked from it
    # (forkserver.py) instead of starting a new interpreter. Empty: every attempt is a fresh exec.
    preload: tuple[str, ...] = ()
    # Added to the controller's niceness for harness processes (0-19): above 0 the trainer, the server and
    # vLLM on the same machine go first, and harnesses take the CPU they leave.
    nice: int = Field(0, ge=0, le=19)

    @model_validator(mode="after")
    def _runnable(self) -> "ControllerSettings":
        if not self.command:
            raise ValueError("command is empty: give the harness command (argv list or shell line)")
        if self.preload:
            if isinstance(self.command, str):
                raise ValueError("preload needs the command as an argv list: [python, SCRIPT, ...]")
            python_target(self.command)
        return self


KeyIssuer = Callable[[Mapping[str, str]], str]  # rollout identity attributes → rollout-scoped API key
KeyRevoker = Callable[[Mapping[str, str]], None]  # the attempt's identity: its key stops working


def classify(returncode: int, *, timed_out: bool, through_shell: bool) -> RolloutStatus:
    """The status of a finished harness process."""
    if timed_out:
        return RolloutStatus.TIMEOUT
    if returncode == 0:
        return RolloutStatus.OK
    # A shell reports its last command's death by signal N as exit status 128 + N.
    if returncode < 0 or (through_shell and 128 < returncode < 128 + signal.NSIG):
        return RolloutStatus.CRASHED
    return RolloutStatus.ERROR


class Controller:
    """Runs rollouts as local harness processes and records each attempt's status as an OTel span."""

    def __init__(
        self,
        settings: ControllerSettings,
        *,
        otlp_endpoint: str,
        openai_base_url: str,
        token: str,
        issue_key: KeyIssuer,
        revoke_key: KeyRevoker | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        if launcher is not None and settings.preload:
            raise ValueError("rollouts.preload forks harnesses outside the launcher: drop it with a launcher")
        self.settings = settings
        # wraps every attempt (the coding sandbox and grader); it sees no variable of this process's own
        self._launcher = launcher
        self._otlp_endpoint = otlp_endpoint.rstrip("/")
        self._openai_base_url = openai_base_url
        self._issue_key = issue_key
        # None: an attempt's key lives out its lifetime on the server (its next attempt's key revokes it)
        self._revoke_key = revoke_key
        self._provider = TracerProvider(resource=Resource.create({"service.name": "otel-rl-controller"}))
        exporter = OTLPSpanExporter(
            endpoint=f"{self._otlp_endpoint}/v1/traces", headers={"authorization": f"Bearer {token}"}
        )
        # A short delay: the online loop waits for these spans to decide that a group is complete.
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
        self._tracer = self._provider.get_tracer(attr.CONTROLLER_SCOPE)
        self._slots: asyncio.Semaphore | None = None
        self._forkserver: ForkServer | None = None
        settings.log_dir.mkdir(parents=True, exist_ok=True)

    def run(self, rollouts: Sequence[Rollout]) -> list[RolloutResult]:
        """Run all rollouts (at most concurrency at a time) and wait until their spans are exported."""
        self._slots = None  # a new event loop needs its own semaphore
        results = asyncio.run(self._run_and_stop(rollouts))
        self.flush()
        return results

    async def _run_and_stop(self, rollouts: Sequence[Rollout]) -> list[RolloutResult]:
        try:
            return await self.run_async(rollouts)
        finally:
            await self.stop_forkserver()

    async def run_async(self, rollouts: Sequence[Rollout]) -> list[RolloutResult]:
        return list(await asyncio.gather(*(self.run_rollout(rollout) for rollout in rollouts)))

    async def run_rollout(self, rollout: Rollout) -> RolloutResult:
        """Run one rollout, retrying timeouts, crashes and infra errors as new attempts."""
        attempts: list[AttemptResult] = []
        while True:
            async with self._concurrency():
                attempt = await self._run_attempt(rollout)
            attempts.append(attempt)
            if attempt.status not in RETRIED or len(attempts) >= self.settings.max_attempts:
                return RolloutResult(rollout, tuple(attempts))

    def flush(self) -> None:
        """Export every finished attempt's span now."""
        self._provider.force_flush()

    def close(self) -> None:
        self._provider.shutdown()

    async def stop_forkserver(self) -> None:
        """With `preload`: end the fork server that serves this event loop (`run` does it itself)."""
        if self._forkserver is not None:
            await self._forkserver.stop()
            self._forkserver = None

    def _concurrency(self) -> asyncio.Semaphore:
        # Created lazily: a semaphore binds to the running event loop.
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.concurrency)
        return self._slots

    async def _run_attempt(self, rollout: Rollout) -> AttemptResult:
        attempt_id = new_id()
        identity = {
            attr.ROLLOUT_ID: rollout.rollout_id,
            attr.ATTEMPT_ID: attempt_id,
            attr.GROUP_ID: rollout.group_id,
            attr.TASK_ID: rollout.task_id,
            attr.SPLIT: rollout.split,
        }
        log_path = self.settings.log_dir / f"{rollout.rollout_id}-{attempt_id}.log"
        span = self._tracer.start_span(attr.ROLLOUT_SPAN_NAME, attributes=identity)
        started = time.monotonic()
        status, exit_code = RolloutStatus.INFRA_ERROR, None
        try:
            status, exit_code = await self._run_process(rollout, identity, span, log_path)
        except asyncio.CancelledError:
            span.set_attribute(attr.ROLLOUT_STATUS, RolloutStatus.INFRA_ERROR.value)
            span.set_status(Status(StatusCode.ERROR, "cancelled by the controller"))
            span.end()
            raise
        except Exception as error:  # no key, no executable, no log file: the rollout never ran properly
            span.record_exception(error)
            _append_error(log_path, error)
        _end_span(span, status, exit_code)
        if self._revoke_key is not None:
            await revoke_quietly(self._revoke_key, identity)
        return AttemptResult(
            attempt_id=attempt_id,
            status=status,
            exit_code=exit_code,
            trace_id=f"{span.get_span_context().trace_id:032x}",
            start_time_unix_nano=span.start_time,
            duration_s=time.monotonic() - started,
            log_path=log_path,
        )

    async def _run_process(
        self, rollout: Rollout, identity: Mapping[str, str], span: Span, log_path: Path
    ) -> tuple[RolloutStatus, int | None]:
        api_key = await asyncio.to_thread(self._issue_key, identity)
        task = rollout.task if self._launcher is None else self._launcher.harness_task(rollout)
        env = harness_environment(
            inherited=os.environ if self._launcher is None else {},
            user_env=self.settings.env,
            otlp_endpoint=self._otlp_endpoint,
            openai_base_url=self._openai_base_url,
            api_key=api_key,
            identity=identity,
            parent=span.get_span_context(),
            task=task,
        )
        argv = harness_argv(self.settings.command, task)
        if self._launcher is None:
            return await self._spawn_and_wait(argv, env, log_path)
        async with self._launcher.attempt(rollout, identity, argv, env) as attempt:
            launch = attempt.launch
            span.set_attributes(launch.attributes)
            status, returncode = await self._spawn_and_wait(
                launch.argv,
                launch.env,
                log_path,
                cwd=launch.cwd,
                pass_fds=launch.pass_fds,
                timeout_s=min(self.settings.timeout_s, launch.timeout_s or self.settings.timeout_s),
            )
            return await attempt.finish(status, returncode, span), returncode

    async def _spawn_and_wait(
        self,
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        pass_fds: Sequence[int] = (),
        timeout_s: float | None = None,
    ) -> tuple[RolloutStatus, int | None]:
        if self.settings.preload:
            process = await self._forked(argv, env, log_path)
        else:
            if self.settings.nice:
                # nice(1) lowers its priority, then execs the harness (same process): from its first
                # instruction, where setting it from here after the start raced the harness's own start.
                # A missing executable stays an error of ours, not an exit status of nice's.
                executable = shutil.which(argv[0], path=env.get("PATH"))
                if executable is None:
                    raise FileNotFoundError(f"harness executable not found: {argv[0]!r}")
                argv = ["nice", "-n", str(self.settings.nice), executable, *argv[1:]]
            with log_path.open("wb") as log:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=cwd,
                    pass_fds=pass_fds,
                    start_new_session=True,  # its own process group, so that a kill reaches every descendant
                )
        timed_out = False
        try:
            try:  # asyncio.timeout: on Python 3.11 wait_for can lose a cancel (kubernetes/cluster.py)
                async with asyncio.timeout(timeout_s or self.settings.timeout_s):
                    returncode = await process.wait()
            except TimeoutError:
                timed_out = True
                returncode = await self._terminate(process)
        finally:
            # Nothing a rollout started may outlive it (also on cancellation).
            _signal_group(process.pid, signal.SIGKILL)
            if process.returncode is None:  # cancelled while it ran: reap it before the event loop ends
                await process.wait()
        through_shell = isinstance(self.settings.command, str)
        return classify(returncode, timed_out=timed_out, through_shell=through_shell), returncode

    async def _forked(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> Forked:
        # Created lazily, like the semaphore: its pipes belong to the running event loop.
        if self._forkserver is None:
            self._forkserver = ForkServer(
                argv[0],
                self.settings.preload,
                base_environment(os.environ, self.settings.env),
                self.settings.log_dir / "forkserver.log",
            )
        return await self._forkserver.spawn(argv, env, log_path, self.settings.nice)

    async def _terminate(self, process: asyncio.subprocess.Process | Forked) -> int:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(self.settings.kill_grace_s):
                return await process.wait()
        except TimeoutError:
            _signal_group(process.pid, signal.SIGKILL)
            return await process.wait()


async def revoke_quietly(revoke_key: KeyRevoker, identity: Mapping[str, str]) -> None:
    """Revoke an ended attempt's key; a failure is logged, not the attempt's: the key still expires."""
    try:
        await asyncio.to_thread(revoke_key, identity)
    except Exception as error:
        log.warning("could not revoke the key of attempt %s: %s", identity.get(attr.ATTEMPT_ID), error)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group has already exited
        os.killpg(pgid, signum)


def _append_error(log_path: Path, error: Exception) -> None:
    with contextlib.suppress(OSError), log_path.open("a") as log:
        log.write(f"otel-rl controller: {type(error).__name__}: {error}\n")


def _end_span(span: Span, status: RolloutStatus, exit_code: int | None) -> None:
    span.set_attribute(attr.ROLLOUT_STATUS, status.value)
    if exit_code is not None:
        span.set_attribute(attr.ROLLOUT_EXIT_CODE, exit_code)
    if status is not RolloutStatus.OK:
        span.set_status(Status(StatusCode.ERROR, status.value))
    span.end()
