"""Online training: harness rollouts in groups → samples → one update → all servers reload, asynchronously."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import polars as pl
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from otel_rl import attributes as attr
from otel_rl.controller import Controller, ControllerSettings, Rollout, RolloutResult, group_rollouts, new_id
from otel_rl.query import sql_list
from otel_rl.store.window import StoreWindow
from otel_rl.train.config import ConfigError, TrainConfig
from otel_rl.train.worker import TrainerProcess

STATE_FILE = "online_state.json"  # in each step-N checkpoint: what a restart resumes from
RUN_FILE = "run.json"  # in output_dir: the run's id, the prefix of its group ids
STORE_WAIT_S = 120.0  # how long a finished rollout's spans may take to reach the store
POLL_S = 0.2
# Reads of a step's attempts start this long before the oldest of them: clocks of other hosts (Kubernetes
# pods) may run a little behind the controller's. Earlier rows are only read, not used.
WINDOW_SLACK_NS = 5_000_000_000


class OnlineTrainingError(RuntimeError):
    """The online loop cannot go on; the message says what to check."""


# --- tasks ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One line of a tasks file: a JSON object with an `id`."""

    task_id: str
    payload: dict[str, Any]


def read_tasks(path: Path) -> list[Task]:
    """The tasks of a JSONL file; errors name the file and line."""
    tasks: list[Task] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            payload = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}:{number}: not JSON ({error})") from None
        if not isinstance(payload, dict) or "id" not in payload:
            raise ConfigError(f'{path}:{number}: a task is a JSON object with an "id"')
        tasks.append(Task(str(payload["id"]), payload))
    if not tasks:
        raise ConfigError(f"{path}: no tasks")
    return tasks


def task_for_group(tasks: Sequence[Task], index: int, seed: int) -> Task:
    """The task of the index-th group: every task once per epoch, in a seeded order per epoch."""
    epoch, position = divmod(index, len(tasks))
    order = list(range(len(tasks)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tasks[order[position]]


# --- what the store says about groups -------------------------------------------------------------------


def final_attempts_only(
    calls: pl.DataFrame, rewards: pl.DataFrame, attempts: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The calls and rewards of each rollout's final attempt (`attempts`: rollout_id, final_attempt,
    attempt_start_ns), without those of the attempts before it, which share its rollout id.

    A call whose attempt is unknown counts when it started after the final attempt did, and a reward when
    the server received it after that (its own time is the sender's clock, which a harness sets).
    """
    starts = attempts.select("rollout_id", "final_attempt", pl.col("attempt_start_ns").cast(pl.Int64))
    calls = (
        calls.join(starts, on="rollout_id", how="left")
        .filter(
            (pl.col("attempt_id") == pl.col("final_attempt"))
            | (
                pl.col("attempt_id").is_null()
                & (pl.col("start_time_unix_nano").cast(pl.Int64) >= pl.col("attempt_start_ns"))
            )
        )
        .drop("final_attempt", "attempt_start_ns")
    )
    rewards = (
        rewards.join(starts, on="rollout_id", how="left")
        .filter(pl.col("received_at").dt.epoch("ns") >= pl.col("attempt_start_ns"))
        .drop("final_attempt", "attempt_start_ns")
    )
    return calls, rewards


def oldest_versions(attempts: pl.DataFrame, groups: Mapping[str, str]) -> dict[str, int | None]:
    """The oldest policy version that sampled any call of each group (None: no call recorded one).

    `attempts` has `attempt_id` and `policy_version` (its oldest call's); `groups` maps attempt ids to groups.
    """
    members = pl.DataFrame({"attempt_id": list(groups), "group_id": list(groups.values())})
    versions = attempts.select(pl.col("attempt_id").cast(pl.String), pl.col("policy_version").cast(pl.Int64))
    oldest = (
        members.join(versions, on="attempt_id", how="left").group_by("group_id").agg(pl.min("policy_version"))
    )
    return dict(oldest.iter_rows())


def reusable_groups(
    rollouts: pl.DataFrame, *, consumed: set[str], group_size: int, oldest_version: int
) -> list[str]:
    """Groups a previous run of this loop finished but never trained on, still fresh enough to use.

    `rollouts` are this run's train rows of the `rollouts` view (one per rollout, its final attempt). A group
    qualifies when all its `group_size` rollouts finished and none has a call older than `oldest_version`.
    """
    groups = (
        rollouts.group_by("group_id")
        .agg(
            pl.len().alias("n"),
            (pl.col("status") == "running").any().alias("running"),
            pl.col("policy_version_min").min().alias("version"),
            pl.col("ended_at").max().alias("ended_at"),
        )
        .filter(
            (pl.col("n") == group_size)
            & ~pl.col("running")
            & (pl.col("version").is_null() | (pl.col("version") >= oldest_version))
            & ~pl.col("group_id").is_in(sorted(consumed))
        )
        .sort("ended_at")
    )
    return groups["group_id"].to_list()


# The loop reads the controller's and the gateway's spans directly where it needs one attempt's facts
# (the `rollouts` view has one row per rollout) or only a few fields cheaply, while rollouts run.


def attempt_progress_sql(attempt_ids: Sequence[str], since_ns: int) -> str:
    """Per attempt (all started at `since_ns` or later): whether its controller status span arrived, and its
    oldest call's policy version. The time bound lets DuckDB skip older row groups: without it every poll
    parsed every stored call's attributes."""
    return (
        f"SELECT attributes ->> '{attr.ATTEMPT_ID}' AS attempt_id, "
        f"bool_or(scope_name = '{attr.CONTROLLER_SCOPE}') AS finished, "
        f"min(TRY_CAST(attributes ->> '{attr.POLICY_VERSION}' AS INTEGER)) "
        f"FILTER (WHERE scope_name = '{attr.GATEWAY_SCOPE}') AS policy_version "
        f"FROM spans WHERE start_time_unix_nano >= {since_ns} "
        f"AND scope_name IN ('{attr.CONTROLLER_SCOPE}', '{attr.GATEWAY_SCOPE}') "
        f"AND attributes ->> '{attr.ATTEMPT_ID}' IN {sql_list(attempt_ids)} GROUP BY 1"
    )


def final_attempts_sql(group_ids: Sequence[str]) -> str:
    """Per rollout of the groups: its final attempt as the controller recorded it, and when it started."""
    return (
        f"SELECT attributes ->> '{attr.ROLLOUT_ID}' AS rollout_id, "
        f"arg_max(attributes ->> '{attr.ATTEMPT_ID}', start_time_unix_nano) AS final_attempt, "
        f"any_value(attributes ->> '{attr.GROUP_ID}') AS group_id, "
        f"any_value(attributes ->> '{attr.TASK_ID}') AS task_id, "
        f"arg_max(attributes ->> '{attr.ROLLOUT_STATUS}', start_time_unix_nano) AS status, "
        "max(start_time_unix_nano) AS attempt_start_ns "
        f"FROM spans WHERE scope_name = '{attr.CONTROLLER_SCOPE}' AND name = '{attr.ROLLOUT_SPAN_NAME}' "
        f"AND attributes ->> '{attr.GROUP_ID}' IN {sql_list(group_ids)} GROUP BY 1"
    )


# --- the server -----------------------------------------------------------------------------------------


class ServerClient:
    """The otel-rl server as the online loop uses it: SQL queries, rollout keys, policy reloads."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._http = httpx.Client(
            base_url=self.url,
            headers={"authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(600, connect=5),
        )

    def query(self, sql: str) -> pl.DataFrame:
        """One read-only statement over the store, on this client's kept-alive connection (a new client per
        query spent a quarter of a step's reads setting up TLS contexts)."""
        from otel_rl.query import query_result

        return pl.from_arrow(query_result(self._request("POST", "/v1/query", json={"sql": sql}), self.url))

    def issue_rollout_key(self, identity: Mapping[str, str]) -> str:
        """A key that acts for one rollout only: its OTLP exports and its model calls (with this identity)."""
        body = {
            "attempt_id": identity[attr.ATTEMPT_ID],
            "group_id": identity[attr.GROUP_ID],
            "task_id": identity[attr.TASK_ID],
            "split": identity[attr.SPLIT],
        }
        response = self._request("POST", f"/v1/admin/rollouts/{identity[attr.ROLLOUT_ID]}/key", json=body)
        _raise_for_status(response, "issue a rollout key")
        return response.json()["key"]

    def policy(self) -> dict[str, Any]:
        """The gateway's current policy: `version`, `checkpoint`, servers, the last reload."""
        response = self._request("GET", "/v1/admin/policy")
        _raise_for_status(response, "read the gateway's policy")
        return response.json()

    def set_policy(self, checkpoint: Path, version: int) -> dict[str, Any]:
        """Pause the gateway, reload every inference server from `checkpoint`, resume at `version`.

        Returns the reload's report (phases in milliseconds: drain, reload, ..., total = time paused).
        """
        body = {"checkpoint": str(Path(checkpoint).resolve()), "version": version}
        response = self._request("POST", "/v1/admin/policy", json=body)
        _raise_for_status(response, f"reload the policy from {checkpoint}")
        return response.json()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise OnlineTrainingError(
                f"cannot reach the otel-rl server at {self.url} ({error}): start `otel-rl serve --vllm URL` "
                "or set server.url"
            ) from None

    def close(self) -> None:
        self._http.close()


def _raise_for_status(response: httpx.Response, action: str) -> None:
    if response.status_code >= 400:
        raise OnlineTrainingError(f"could not {action}: HTTP {response.status_code} {response.text[:500]}")


def server_token(config: TrainConfig) -> str:
    """The admin token: the config's, else OTEL_RL_TOKEN or OTEL_RL_TOKEN_FILE, else the server's file."""
    from otel_rl.auth import TOKEN_FILE, client_token

    token = client_token(config.server.token)
    if token is None:
        raise ConfigError(
            "no server token: set server.token, OTEL_RL_TOKEN or OTEL_RL_TOKEN_FILE, "
            f"or run `otel-rl serve` here ({TOKEN_FILE})"
        )
    return token


# --- records --------------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """One online step: what it trained on and how long each phase took (an `otel_rl.train.step` span)."""

    step: int
    policy_version: int  # the version this step produced
    group_ids: list[str]
    reward_mean: float
    success_rate: float
    rollouts: int
    samples: int
    sampled_tokens: int
    response_tokens: int
    stale_groups: int  # groups dropped, older than max_staleness
    collect_s: float
    transform_s: float
    train_s: float
    save_s: float
    reload_s: float
    paused_s: float  # how long the gateway held new harness calls for the reload
    drain_s: float  # of which: waiting for the calls in flight to finish before swapping weights
    wall_s: float
    trainer: dict[str, float] = field(default_factory=dict)  # the trainer's metrics (loss, mismatch, ...)


@dataclass
class EvalRecord:
    """One evaluation: every val task once, at one policy version (also an `otel_rl.train.eval` span)."""

    name: str  # which eval command (eval.harnesses), "eval" for the single eval.harness
    step: int
    policy_version: int
    rollouts: int
    reward_mean: float
    success_rate: float
    wall_s: float


@dataclass
class OnlineResult:
    run_id: str
    steps: list[StepRecord]
    evals: list[EvalRecord]
    wall_s: float


class RunRecorder:
    """Writes step and evaluation records to the store as spans (scope otel_rl.train), over OTLP."""

    def __init__(self, server_url: str, token: str, run_id: str) -> None:
        self.run_id = run_id
        self._provider = TracerProvider(resource=Resource.create({"service.name": "otel-rl-train"}))
        exporter = OTLPSpanExporter(
            endpoint=f"{server_url.rstrip('/')}/v1/traces", headers={"authorization": f"Bearer {token}"}
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
        self._tracer = self._provider.get_tracer(attr.TRAIN_SCOPE)

    def record(self, name: str, record: StepRecord | EvalRecord, started_ns: int) -> None:
        values = asdict(record)
        trainer = values.pop("trainer", {})
        attributes: dict[str, Any] = {
            attr.TRAIN_RUN_ID: self.run_id,
            attr.POLICY_VERSION: record.policy_version,
        }
        attributes |= {
            f"{attr.TRAIN_PREFIX}{key}": value for key, value in values.items() if key != "policy_version"
        }
        attributes |= {f"{attr.TRAIN_PREFIX}trainer.{key}": value for key, value in trainer.items()}
        self._tracer.start_span(name, attributes=attributes, start_time=started_ns).end()
        self._provider.force_flush()

    def close(self) -> None:
        self._provider.shutdown()


# --- the loop -------------------------------------------------------------------------------------------


@dataclass
class OnlineState:
    """What a restart resumes from, saved as STATE_FILE in every checkpoint."""

    step: int = 0  # updates done
    version: int = 0  # the gateway's policy version of this run's current weights
    next_group: int = 0  # groups launched: the position in the task order
    consumed: list[str] = field(default_factory=list)  # group ids trained on, all steps


def run_id_of(output_dir: Path) -> str:
    """The run's id, created on the first start; it prefixes every group id of the run."""
    path = output_dir / RUN_FILE
    if path.is_file():
        return json.loads(path.read_text())["run_id"]
    output_dir.mkdir(parents=True, exist_ok=True)
    run_id = new_id()[:12]
    path.write_text(json.dumps({"run_id": run_id}))
    return run_id


def latest_checkpoint(output_dir: Path) -> tuple[Path, OnlineState] | None:
    """The newest complete step-N checkpoint of an online run and its state, if any."""
    found = [
        (int(path.parent.name.removeprefix("step-")), path.parent)
        for path in output_dir.glob(f"step-*/{STATE_FILE}")
        if path.parent.name.removeprefix("step-").isdigit()
    ]
    if not found:
        return None
    _, directory = max(found)
    return directory, OnlineState(**json.loads((directory / STATE_FILE).read_text()))


@dataclass
class _FinishedGroup:
    group_id: str
    results: list[RolloutResult]  # empty for a group found finished in the store at resume


class OnlineLoop:
    """Keeps groups of rollouts running while it trains on the finished ones (see docs/training.md)."""

    def __init__(self, config: TrainConfig, client: ServerClient, console: Console | None = None) -> None:
        config.require_online()
        self.config = config
        self.client = client
        self.window = StoreWindow()  # a step's reads
        self.console = console or Console(stderr=True)
        self.tasks = read_tasks(config.online.tasks)
        self.val_tasks = read_tasks(config.eval.tasks) if config.eval.tasks else []
        self.run_id = run_id_of(config.output_dir)
        resumed = latest_checkpoint(config.output_dir)
        self.checkpoint, self.state = resumed if resumed else (config.model, OnlineState())
        online = config.online
        train_settings = ControllerSettings(
            command=online.harness,
            concurrency=online.concurrency,
            timeout_s=online.timeout_s,
            max_attempts=online.max_attempts,
            log_dir=config.output_dir / "rollouts",
            env=online.env,
            preload=online.preload,
            nice=online.nice,
        )
        connection = {
            "otlp_endpoint": client.url,
            "openai_base_url": f"{client.url}/v1",
            "token": client.token,
            "issue_key": client.issue_rollout_key,
        }
        self.controller = Controller(train_settings, **connection)
        eval_commands = config.eval.harnesses or {"eval": config.eval.harness or online.harness}
        self.eval_controllers = {
            name: Controller(
                replace(
                    train_settings,
                    command=command,
                    env={**online.env, **config.eval.env},
                    log_dir=config.output_dir / "eval" / name,
                ),
                **connection,
            )
            for name, command in eval_commands.items()
        }
        self.recorder = RunRecorder(client.url, client.token, self.run_id)
        self._finished: asyncio.Queue[_FinishedGroup] = asyncio.Queue()
        self._room = asyncio.Condition()
        self._outstanding = 0  # groups launched (or reused) and not yet trained on or dropped
        self._group_tasks: set[asyncio.Task] = set()

    # The staleness bound: a group launched now is trained on at the latest max_staleness versions later.
    @property
    def max_outstanding(self) -> int:
        return self.config.algorithm.groups_per_step * (self.config.algorithm.max_staleness + 1)

    async def run(self) -> OnlineResult:
        config = self.config.model_copy(update={"model": self.checkpoint})
        trainer = await asyncio.to_thread(TrainerProcess, config)
        try:
            return await self._run(trainer)
        finally:
            trainer.close()

    async def _run(self, trainer: TrainerProcess) -> OnlineResult:
        started = time.monotonic()
        steps: list[StepRecord] = []
        evals: list[EvalRecord] = []
        if self.state.step > 0:  # resuming: continue with the optimizer where the checkpoint left it
            await asyncio.to_thread(trainer.load_state, self.checkpoint)
        await asyncio.to_thread(self._publish_start)
        for group_id in await asyncio.to_thread(self._reusable_groups):
            self._finished.put_nowait(_FinishedGroup(group_id, []))
            self._outstanding += 1
        launcher = asyncio.create_task(self._launch_groups())
        try:
            with self._progress() as progress:
                bar = progress.add_task(
                    "online", total=self.config.steps, completed=self.state.step, phase=""
                )
                if self.val_tasks and self.state.step == 0:
                    evals += await self._evaluate_all(progress.console)
                while self.state.step < self.config.steps:
                    record = await self._step(trainer, lambda text: progress.update(bar, phase=text))
                    steps.append(record)
                    progress.update(bar, completed=self.state.step)
                    progress.console.print(format_step(record))
                    if self.val_tasks and self._eval_due():
                        evals += await self._evaluate_all(progress.console)
        finally:
            launcher.cancel()
            for task in list(self._group_tasks):
                task.cancel()
            await asyncio.gather(launcher, *self._group_tasks, return_exceptions=True)
            for controller in (self.controller, *self.eval_controllers.values()):
                await controller.stop_forkserver()
                controller.close()
            self.recorder.close()
        return OnlineResult(self.run_id, steps, evals, time.monotonic() - started)

    def _publish_start(self) -> None:
        """Make every server serve this run's current weights (versions only increase on a gateway)."""
        current = self.client.policy()
        if (
            current["checkpoint"] == str(Path(self.checkpoint).resolve())
            and current["version"] == self.state.version
        ):
            return  # a restart of the loop against a server that already serves its weights
        # Keep this run's numbering when the server restarted (its version went back to 0).
        self.state.version = max(current["version"] + 1, self.state.version)
        self.client.set_policy(self.checkpoint, self.state.version)

    def _eval_due(self) -> bool:
        every = self.config.eval.every
        return self.state.step == self.config.steps or (every > 0 and self.state.step % every == 0)

    def _progress(self) -> Progress:
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[phase]}"),
            TimeElapsedColumn(),
            console=self.console,
        )

    # --- launching -----------------------------------------------------------------------------------

    async def _launch_groups(self) -> None:
        algo = self.config.algorithm
        while True:
            async with self._room:
                await self._room.wait_for(lambda: self._outstanding < self.max_outstanding)
                self._outstanding += 1
            task = task_for_group(self.tasks, self.state.next_group, self.config.seed)
            self.state.next_group += 1
            group_id = f"{self.run_id}-{new_id()[:16]}"
            rollouts = group_rollouts(task.task_id, task.payload, algo.group_size, group_id=group_id)
            running = asyncio.create_task(self._run_group(group_id, rollouts))
            self._group_tasks.add(running)
            running.add_done_callback(self._group_tasks.discard)

    async def _run_group(self, group_id: str, rollouts: list[Rollout]) -> None:
        results = await asyncio.gather(*(self.controller.run_rollout(rollout) for rollout in rollouts))
        await self._finished.put(_FinishedGroup(group_id, list(results)))

    async def _release(self, n_groups: int) -> None:
        async with self._room:
            self._outstanding -= n_groups
            self._room.notify_all()

    def _reusable_groups(self) -> list[str]:
        rows = self.client.query(
            "SELECT group_id, status, ended_at, policy_version_min "
            f"FROM rollouts WHERE split = 'train' AND starts_with(group_id, '{self.run_id}-')"
        )
        oldest = self.state.version - self.config.algorithm.max_staleness
        found = reusable_groups(
            rows,
            consumed=set(self.state.consumed),
            group_size=self.config.algorithm.group_size,
            oldest_version=oldest,
        )
        # More than the staleness bound allows in flight would only go stale again.
        return found[: self.max_outstanding]

    # --- one step ------------------------------------------------------------------------------------

    async def _step(self, trainer: TrainerProcess, show: Callable[[str], None]) -> StepRecord:
        from otel_rl.transforms.export import to_dataproto

        started, started_ns = time.monotonic(), time.time_ns()
        version = self.state.version
        stale_total, empty_rounds = 0, 0
        while True:
            show(f"collecting {self.config.algorithm.groups_per_step} groups")
            collect_started = time.monotonic()
            groups, stale = await self._collect(version)
            stale_total += stale
            collected = time.monotonic()
            show("building samples")
            samples, report = await asyncio.to_thread(self._samples, groups, version)
            transformed = time.monotonic()
            if samples.height:
                break
            await self._release(len(groups))
            empty_rounds += 1
            self.console.print(f"[yellow]{len(groups)} groups gave no samples: {report.dropped_rollouts}")
            if empty_rounds == 3:
                raise OnlineTrainingError(
                    "three batches of groups in a row gave no samples; see the `rollouts` view and the "
                    f"harness logs in {self.config.output_dir / 'rollouts'}"
                )
        show(f"training on {samples.height} samples")
        batch = to_dataproto(samples, trainer.pad_token_id)
        metrics = await asyncio.to_thread(trainer.step, batch)
        trained = time.monotonic()
        self.state.step += 1
        self.state.version = version + 1
        self.state.consumed.extend(groups)
        show("saving")
        self.checkpoint = await asyncio.to_thread(self._save, trainer)
        saved = time.monotonic()
        show("reloading servers")
        reload = await asyncio.to_thread(self.client.set_policy, self.checkpoint, self.state.version)
        reloaded = time.monotonic()
        await self._release(len(groups))
        rewards = samples.group_by("rollout_id").agg(pl.col("reward").first())["reward"]
        record = StepRecord(
            step=self.state.step,
            policy_version=self.state.version,
            group_ids=groups,
            reward_mean=float(rewards.mean()),
            success_rate=float((rewards >= 1).mean()),
            rollouts=rewards.len(),
            samples=samples.height,
            sampled_tokens=report.sampled_tokens,
            response_tokens=report.response_tokens,
            stale_groups=stale_total,
            collect_s=collected - collect_started,
            transform_s=transformed - collected,
            train_s=trained - transformed,
            save_s=saved - trained,
            reload_s=reloaded - saved,
            paused_s=reload["total_ms"] / 1000,
            drain_s=reload["drain_ms"] / 1000,
            wall_s=reloaded - started,
            trainer={key: float(value) for key, value in metrics.items()},
        )
        # Exported now: a loop killed later must not lose the record of a step whose checkpoint exists.
        await asyncio.to_thread(self.recorder.record, attr.TRAIN_STEP_SPAN_NAME, record, started_ns)
        return record

    async def _collect(self, version: int) -> tuple[list[str], int]:
        """B finished groups whose spans are all in the store and none older than max_staleness."""
        need = self.config.algorithm.groups_per_step
        oldest = version - self.config.algorithm.max_staleness
        chosen: list[str] = []
        stale = 0
        while len(chosen) < need:
            batch = [await self._finished.get()]
            while len(chosen) + len(batch) < need and not self._finished.empty():
                batch.append(self._finished.get_nowait())
            versions = await self._await_in_store([r for group in batch for r in group.results])
            for group in batch:
                group_version = versions.get(group.group_id)
                if group_version is not None and group_version < oldest:
                    stale += 1
                    await self._release(1)
                else:
                    chosen.append(group.group_id)
        return chosen, stale

    async def _await_in_store(self, results: Sequence[RolloutResult]) -> dict[str, int | None]:
        """Wait until the store has the status span of every final attempt; the groups' oldest versions.

        The controller exports an attempt's span after its harness exited, so by then the harness's own
        spans and rewards (exported before it exits) and the gateway's call spans are in the store too.
        """
        finals = {r.attempts[-1].attempt_id: r.rollout.group_id for r in results}
        if not finals:
            return {}
        since = min(r.attempts[-1].start_time_unix_nano for r in results) - WINDOW_SLACK_NS
        deadline = time.monotonic() + STORE_WAIT_S
        while True:
            rows = await asyncio.to_thread(self.client.query, attempt_progress_sql(sorted(finals), since))
            missing = set(finals) - set(rows.filter(pl.col("finished"))["attempt_id"])
            if not missing:
                return oldest_versions(rows, finals)
            if time.monotonic() > deadline:
                raise OnlineTrainingError(
                    f"{len(missing)} finished rollouts have no status in the store after "
                    f"{STORE_WAIT_S:.0f} s: does {self.client.url} receive the controller's spans?"
                )
            await asyncio.sleep(POLL_S)

    def _samples(self, groups: list[str], version: int) -> tuple[pl.DataFrame, Any]:
        from otel_rl.transforms.rewards import RewardSpec
        from otel_rl.transforms.samples import CALL_COLUMNS, SampleOptions, build_samples

        attempts = self.client.query(final_attempts_sql(groups))
        rollouts = attempts.select(
            "rollout_id", pl.col("final_attempt").alias("attempt_id"), "group_id", "task_id", "status"
        )
        # What is read below (the final attempts' calls and rewards) started after the oldest final attempt
        # did: the views over the store's rows since then give it at a cost that does not grow with the store.
        since = int(attempts["attempt_start_ns"].min()) - WINDOW_SLACK_NS
        self.window.load(self.client.query, since)
        # The policy's calls are the gateway's, with exact token ids; a harness's calls to any other model
        # are not samples of the policy. gateway_call_tokens reads just those, without parsing messages.
        calls = self.window.query(
            f"SELECT {', '.join(CALL_COLUMNS)}, attempt_id FROM gateway_call_tokens "
            f"WHERE group_id IN {sql_list(groups)} ORDER BY rollout_id, start_time_unix_nano"
        )
        rewards = self.window.query(
            f"SELECT * FROM rewards WHERE rollout_id IN {sql_list(rollouts['rollout_id'].to_list())}"
        )
        calls, rewards = final_attempts_only(calls, rewards, attempts)
        reward = self.config.reward
        options = SampleOptions(
            reward=RewardSpec(reward.name, reward.rule, tuple(reward.trusted_sources), reward.missing),
            estimator=self.config.algorithm.advantage_estimator,
            current_policy_version=version,
            max_staleness=self.config.algorithm.max_staleness,
        )
        return build_samples(calls, rollouts, rewards, options=options)  # exact ids: no tokenizer needed

    def _save(self, trainer: TrainerProcess) -> Path:
        """step-N: the weights vLLM reloads, plus the state a restart resumes from (written atomically)."""
        final = self.config.output_dir / f"step-{self.state.step}"
        partial = self.config.output_dir / f".step-{self.state.step}.partial"
        trainer.save(partial)
        state_file = trainer.save_state(partial).name
        (partial / STATE_FILE).write_text(json.dumps(asdict(self.state)))
        if final.exists():
            import shutil

            shutil.rmtree(final)
        os.replace(partial, final)
        # Only the newest checkpoint is resumed from: older ones keep their weights, not the optimizer.
        (self.config.output_dir / f"step-{self.state.step - 1}" / state_file).unlink(missing_ok=True)
        return final

    # --- evaluation ----------------------------------------------------------------------------------

    async def _evaluate_all(self, console: Console) -> list[EvalRecord]:
        # At the same time: the same policy version serves all of them, in bigger vLLM batches.
        records = await asyncio.gather(*(self._evaluate(*named) for named in self.eval_controllers.items()))
        for record in records:
            console.print(format_eval(record))
        return list(records)

    async def _evaluate(self, name: str, controller: Controller) -> EvalRecord:
        """Every val task once at the current policy version, with one of the eval commands."""
        started, started_ns = time.monotonic(), time.time_ns()
        group_id = f"{self.run_id}-{name}-{new_id()[:8]}"
        rollouts = [Rollout(new_id(), group_id, task.task_id, task.payload, "val") for task in self.val_tasks]
        results = await asyncio.gather(*(controller.run_rollout(rollout) for rollout in rollouts))
        await self._await_in_store(results)
        rows = self.client.query(f"SELECT outcome_reward FROM rollouts WHERE group_id = '{group_id}'")
        rewards = rows["outcome_reward"].fill_null(0.0)  # no reward (the harness failed): a failure
        record = EvalRecord(
            name=name,
            step=self.state.step,
            policy_version=self.state.version,
            rollouts=rows.height,
            reward_mean=float(rewards.mean()),
            success_rate=float((rewards >= 1).mean()),
            wall_s=time.monotonic() - started,
        )
        await asyncio.to_thread(self.recorder.record, attr.TRAIN_EVAL_SPAN_NAME, record, started_ns)
        return record


def format_step(record: StepRecord) -> str:
    mismatch = record.trainer.get("mismatch")
    return (
        f"step {record.step:>4}  reward {record.reward_mean:.3f}  success {record.success_rate:6.1%}  "
        f"samples {record.samples}  tokens {record.sampled_tokens}  stale {record.stale_groups}  "
        f"collect {record.collect_s:.2f}s  transform {record.transform_s:.2f}s  train {record.train_s:.2f}s  "
        f"reload {record.reload_s:.2f}s" + (f"  mismatch {mismatch:.2e}" if mismatch is not None else "")
    )


def format_eval(record: EvalRecord) -> str:
    return (
        f"[bold]{record.name} at version {record.policy_version}: success {record.success_rate:.1%}, "
        f"reward {record.reward_mean:.3f} over {record.rollouts} val tasks ({record.wall_s:.1f}s)"
    )


def run_online(config: TrainConfig, console: Console | None = None) -> OnlineResult:
    """`otel-rl train --config FILE`: the online loop against the running server at config.server.url."""
    client = ServerClient(config.server.url, server_token(config))
    try:
        return asyncio.run(_until_terminated(OnlineLoop(config, client, console)))
    finally:
        client.close()


async def _until_terminated(loop: OnlineLoop) -> OnlineResult:
    """Run the loop; SIGTERM stops it like Ctrl-C does, so that its harness processes are stopped too."""
    main = asyncio.current_task()
    terminated = asyncio.Event()

    def terminate() -> None:
        terminated.set()
        main.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await loop.run()
    except asyncio.CancelledError:
        if not terminated.is_set():
            raise  # Ctrl-C: asyncio.run turns it back into KeyboardInterrupt
        raise OnlineTrainingError(
            f"stopped by SIGTERM after step {loop.state.step}; run the same command again to resume"
        ) from None
