"""Online training: harness rollouts in groups → samples → one update → all servers reload, asynchronously.

The loop; its edges live beside it: tasks.py, groups.py (what the store says about groups), server_client.py,
records.py and resume.py.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from otel_rl import attributes as attr
from otel_rl.controller import Controller, ControllerSettings, Rollout, RolloutResult, group_rollouts, new_id
from otel_rl.store.window import StoreWindow
from otel_rl.train.config import TrainConfig
from otel_rl.train.groups import (
    WINDOW_SLACK_NS,
    attempt_progress_sql,
    oldest_versions,
    read_groups,
    reusable_groups,
)
from otel_rl.train.records import EvalRecord, OnlineResult, RunRecorder, StepRecord, format_eval, format_step
from otel_rl.train.resume import OnlineState, latest_checkpoint, run_id_of, save_checkpoint
from otel_rl.train.server_client import OnlineTrainingError, ServerClient, server_token
from otel_rl.train.tasks import read_tasks, task_for_group
from otel_rl.train.worker import TrainerProcess

STORE_WAIT_S = 120.0  # how long a finished rollout's spans may take to reach the store
POLL_S = 0.2


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
        from otel_rl.transforms.rewards import trust_setting

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
            why = report.why_dropped(trust_setting)  # the senders' text: printed without rich markup
            if report.untrusted_rewards or not samples.height:
                self.console.print(f"{len(groups)} groups gave {samples.height} samples: {why}", markup=False)
            if samples.height:
                break
            await self._release(len(groups))
            empty_rounds += 1
            if empty_rounds == 3:
                raise OnlineTrainingError(
                    f"three batches of groups in a row gave no samples ({why}); see the `rollouts` view and "
                    f"the harness logs in {self.config.output_dir / 'rollouts'}"
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
        from otel_rl.transforms.samples import SampleOptions, build_samples

        calls, rollouts, rewards = read_groups(self.client.query, self.window, groups)
        options = SampleOptions(
            reward=self.config.reward.spec(),
            estimator=self.config.algorithm.advantage_estimator,
            current_policy_version=version,
            max_staleness=self.config.algorithm.max_staleness,
        )
        return build_samples(calls, rollouts, rewards, options=options)  # exact ids: no tokenizer needed

    def _save(self, trainer: TrainerProcess) -> Path:
        return save_checkpoint(trainer, self.state, self.config.output_dir)

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
