"""Held-out evaluation during online training: every val task once, with each eval command, at one version."""

from __future__ import annotations

import asyncio
import time
from functools import partial

from rich.console import Console

from otel_rl import attributes as attr
from otel_rl.controller import Rollout, new_id
from otel_rl.controller.backends import RolloutRunner
from otel_rl.store import reads
from otel_rl.train.config import TrainConfig
from otel_rl.train.controllers import eval_settings, open_runner
from otel_rl.train.groups import await_in_store
from otel_rl.train.records import EvalRecord, RunRecorder, format_eval
from otel_rl.train.resume import OnlineState
from otel_rl.train.server_client import ServerClient
from otel_rl.train.tasks import Task
from otel_rl.transforms.rewards import outcome_rewards


class Evaluator:
    """The eval commands of `config.eval` (one named "eval" unless `eval.harnesses` names several)."""

    def __init__(
        self,
        config: TrainConfig,
        client: ServerClient,
        val_tasks: list[Task],
        run_id: str,
        recorder: RunRecorder,
    ) -> None:
        self.config, self.client, self.val_tasks = config, client, val_tasks
        self.run_id, self.recorder = run_id, recorder
        commands = config.eval.harnesses or {"eval": config.eval.harness or config.online.harness}
        self.runners: dict[str, RolloutRunner] = {
            name: open_runner(
                config, client, eval_settings(config, command, config.output_dir / "eval" / name), run_id
            )
            for name, command in commands.items()
        }

    def due(self, step: int) -> bool:
        """After the last step, and every `eval.every` steps (before the first one: the loop's choice)."""
        every = self.config.eval.every
        return step == self.config.steps or (every > 0 and step % every == 0)

    async def evaluate_all(self, state: OnlineState, console: Console) -> list[EvalRecord]:
        """Every eval command at once (the same policy version serves all of them, in bigger vLLM batches)."""
        step, version = state.step, state.version
        records = await asyncio.gather(
            *(self._evaluate(name, runner, step, version) for name, runner in self.runners.items())
        )
        for record in records:
            console.print(format_eval(record))
        return list(records)

    async def aclose(self) -> None:
        for runner in self.runners.values():
            await runner.aclose()

    async def _evaluate(self, name: str, runner: RolloutRunner, step: int, version: int) -> EvalRecord:
        """Every val task once at the current policy version, with one of the eval commands."""
        started, started_ns = time.monotonic(), time.time_ns()
        group_id = f"{self.run_id}-{name}-{new_id()[:8]}"
        rollouts = [Rollout(new_id(), group_id, task.task_id, task.payload, "val") for task in self.val_tasks]
        results = await asyncio.gather(*(runner.run_rollout(rollout) for rollout in rollouts))
        _, seen = await await_in_store(self.client, results)
        run = partial(self.client.query, after_commit=seen)
        rows = reads.group_rollout_ids(run, group_id)
        # the reward training uses (its trusted sources and rule), not whatever the harness reported
        given = outcome_rewards(reads.group_rewards(run, group_id), self.config.reward.spec())
        rows = rows.join(given, on="rollout_id", how="left")
        rewards = rows["reward"].fill_null(0.0)  # no trusted reward (the harness failed): a failure
        record = EvalRecord(
            name=name,
            step=step,
            policy_version=version,
            rollouts=rows.height,
            reward_mean=float(rewards.mean()),
            success_rate=float((rewards >= 1).mean()),
            wall_s=time.monotonic() - started,
        )
        await asyncio.to_thread(self.recorder.record, attr.TRAIN_EVAL_SPAN_NAME, record, started_ns)
        return record
