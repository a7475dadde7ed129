"""Online training: harness rollouts in groups → samples → one update → all servers reload, asynchronously.

The loop, top to bottom: `run` starts the trainer (the configured backend, in a process of its own), makes
the servers serve the run's weights, keeps groups of rollouts running, and alternates updates (`_step`) with
held-out evaluations. Its edges live beside it: launcher.py (groups in flight, the staleness bound),
batches.py (a step's samples), groups.py (what the store says about groups), resume.py (checkpoints, the
run's state), evaluation.py, progress.py, records.py, server_client.py, controllers.py, tasks.py.
"""

from __future__ import annotations

import asyncio
import signal
import time
from contextlib import AsyncExitStack

import polars as pl
from rich.console import Console

from otel_rl import attributes as attr
from otel_rl.controller.backends import RolloutRunner
from otel_rl.train.batches import StepBatch, collect_batch
from otel_rl.train.config import TrainConfig
from otel_rl.train.controllers import open_runner, train_settings
from otel_rl.train.evaluation import Evaluator
from otel_rl.train.launcher import GroupLauncher
from otel_rl.train.progress import StepProgress
from otel_rl.train.records import EvalRecord, OnlineResult, RunRecorder, StepRecord
from otel_rl.train.reprobe import report as report_reprobe
from otel_rl.train.reprobe import reprobe, reprobe_due
from otel_rl.train.resume import (
    OnlineState,
    latest_checkpoint,
    publish_start,
    run_id_of,
    save_checkpoint,
    unused_groups,
)
from otel_rl.train.server_client import OnlineTrainingError, ServerClient, server_token
from otel_rl.train.tasks import Task, read_tasks
from otel_rl.train.worker import TrainerProcess


class OnlineLoop:
    """Keeps groups of rollouts running while it trains on the finished ones (see docs/training.md)."""

    def __init__(self, config: TrainConfig, client: ServerClient, console: Console | None = None) -> None:
        config.require_online()
        self.config = config
        self.client = client
        self.console = console or Console(stderr=True)
        self.tasks = read_tasks(config.online.tasks)
        self.val_tasks = read_tasks(config.eval.tasks) if config.eval.tasks else []
        self.run_id = run_id_of(config.output_dir)
        self.colocated = False  # read from the gateway at the start (`serve --colocated`)
        resumed = latest_checkpoint(config.output_dir)
        self.checkpoint, self.state = resumed if resumed else (config.model, OnlineState())
        self._next_batch: asyncio.Task[StepBatch] | None = None  # collected and built during an update

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
        await asyncio.to_thread(publish_start, self.client, self.checkpoint, self.state)
        # `serve --colocated`: the servers sleep while the trainer updates on the same devices
        self.colocated = bool((await asyncio.to_thread(self.client.policy)).get("colocated"))
        async with AsyncExitStack() as stack:  # closed in reverse: groups stopped first, the recorder last
            recorder = RunRecorder(self.client.url, self.client.token, self.run_id, self.config.reward.spec())
            stack.callback(recorder.close)
            await asyncio.to_thread(recorder.start)
            evaluator = None
            if self.val_tasks:
                evaluator = Evaluator(self.config, self.client, self.val_tasks, self.run_id, recorder)
                stack.push_async_callback(evaluator.aclose)
            runner = open_runner(self.config, self.client, train_settings(self.config), self.run_id)
            launcher = GroupLauncher(self.config, self.client, runner, self.tasks, self.run_id, self.state)
            stack.push_async_callback(launcher.aclose)
            stack.push_async_callback(self._drop_next_batch)  # before the launcher it collects from
            reused = await asyncio.to_thread(unused_groups, self.client, self.config, self.run_id, self.state)
            launcher.start(reused)
            with StepProgress(self.console, self.config.steps, self.state.step) as progress:
                if evaluator and self.state.step == 0:
                    evals += await evaluator.evaluate_all(self.state, progress.console)
                while self.state.step < self.config.steps:
                    record = await self._step(trainer, launcher, recorder, progress)
                    steps.append(record)
                    progress.step_done(record)
                    if reprobe_due(self.config, self.state.step):  # controller.coding.reprobe_every
                        launcher.tasks = await self._reprobe(runner, progress.console)
                    if evaluator and evaluator.due(self.state.step):
                        evals += await evaluator.evaluate_all(self.state, progress.console)
        return OnlineResult(self.run_id, steps, evals, time.monotonic() - started)

    async def _reprobe(self, runner: RolloutRunner, console: Console) -> list[Task]:
        """Probe the run's tasks with the policy just loaded: the tasks curation keeps train from now on."""
        step = self.state.step
        kept, chosen = await reprobe(
            self.config, self.client, runner, self.tasks, run_id=self.run_id, step=step
        )
        report_reprobe(console, step, self.tasks, chosen)
        return kept

    async def _step(
        self, trainer: TrainerProcess, launcher: GroupLauncher, recorder: RunRecorder, progress: StepProgress
    ) -> StepRecord:
        """One update: B fresh groups' samples → the trainer → a checkpoint → every server reloads it."""
        from otel_rl.transforms.export import to_dataproto

        started, started_ns = time.monotonic(), time.time_ns()
        version = self.state.version
        batch = await self._batch(launcher, version, progress)
        batch_ready = time.monotonic()
        if self.colocated:
            progress.show("putting the servers to sleep")
            await asyncio.to_thread(self.client.sleep_servers)
        train_started = time.monotonic()
        progress.show(f"training on {batch.samples.height} samples")

        # Its tensors are built in its thread too (the first call imports verl): the next batch's collection
        # starts now, not after them.
        def update() -> dict[str, float]:
            return trainer.step(to_dataproto(batch.samples, trainer.pad_token_id))

        training = asyncio.create_task(asyncio.to_thread(update))
        if self.state.step + 1 < self.config.steps:
            # The next batch is collected and built while this update runs (on a GPU the transform's CPU
            # work is free there): its groups are those finished by then, as they would be after the
            # reload, and their staleness is judged against the version this update makes.
            self._next_batch = asyncio.create_task(
                collect_batch(self.config, self.client, launcher, version + 1, _quiet, self.console)
            )
        metrics = await training
        trained = time.monotonic()
        self.state.step += 1
        self.state.version = version + 1
        self.state.consumed.extend(batch.groups)
        progress.show("saving")
        self.checkpoint = await asyncio.to_thread(
            save_checkpoint, trainer, self.state, self.config.output_dir
        )
        saved = time.monotonic()
        progress.show("waking the servers" if self.colocated else "reloading servers")
        reloads = self.client.wake_servers if self.colocated else self.client.set_policy
        reload = await asyncio.to_thread(reloads, self.checkpoint, self.state.version)
        reloaded = time.monotonic()
        await launcher.release(len(batch.groups))
        rewards = batch.samples.group_by("rollout_id").agg(pl.col("reward").first())["reward"]
        record = StepRecord(
            step=self.state.step,
            policy_version=self.state.version,
            group_ids=batch.groups,
            reward_mean=float(rewards.mean()),
            success_rate=float((rewards >= 1).mean()),
            rollouts=rewards.len(),
            samples=batch.samples.height,
            sampled_tokens=batch.report.sampled_tokens,
            response_tokens=batch.report.response_tokens,
            stale_groups=batch.stale_groups,
            collect_s=batch.collect_s,
            transform_s=batch.transform_s,
            train_s=trained - train_started,
            save_s=saved - trained,
            reload_s=reloaded - saved,
            paused_s=reload["total_ms"] / 1000,
            drain_s=reload["drain_ms"] / 1000,
            wall_s=reloaded - started,
            trainer={key: float(value) for key, value in metrics.items()},
            screened=batch.report.screened,
            transform_wait_s=batch.transform.wait_s,
            transform_read_s=batch.transform.read_s,
            transform_build_s=batch.transform.build_s,
            colocated_pause_s=reload["colocated_pause_ms"] / 1000 if self.colocated else None,
            batch_wait_s=batch_ready - started,
            # the transform ran from ready_at - transform_s to ready_at: the part after this step started
            transform_waited_s=min(batch.transform_s, max(0.0, batch.ready_at - started)),
        )
        # Exported now: a loop killed later must not lose the record of a step whose checkpoint exists.
        await asyncio.to_thread(recorder.record, attr.TRAIN_STEP_SPAN_NAME, record, started_ns)
        return record

    async def _batch(self, launcher: GroupLauncher, version: int, progress: StepProgress) -> StepBatch:
        """The step's batch: the one built during the last update, or one collected now (the first step, a
        resumed run's first)."""
        if self._next_batch is None:
            show = progress.show
            return await collect_batch(self.config, self.client, launcher, version, show, self.console)
        building, self._next_batch = self._next_batch, None
        if not building.done():
            progress.show(f"waiting for {self.config.algorithm.groups_per_step} groups and their samples")
        return await building

    async def _drop_next_batch(self) -> None:
        """A run that ends (or fails) with a batch still being built: stop building it (its groups are
        finished and not trained on: a resumed run takes them, resume.unused_groups)."""
        if self._next_batch is not None:
            self._next_batch.cancel()
            await asyncio.gather(self._next_batch, return_exceptions=True)
            self._next_batch = None


def _quiet(_phase: str) -> None:
    """The progress line of a batch built during an update: it shows the update."""


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
