"""Group launching: keep groups of rollouts running, within the staleness bound, while the loop trains.

A group launched now is trained on at the latest `max_staleness` versions later, so at most
groups_per_step × (max_staleness + 1) groups are outstanding (launched or reused, not yet trained on or
dropped); the loop releases a group's room when it trains on it or drops it. A resumed run first takes back
the groups its killed predecessor left running (`runner.in_flight()`: Kubernetes Jobs live on), which count
against that bound and are trained on, or dropped as stale, like the groups it launches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from otel_rl.controller import Rollout, RolloutResult, group_rollouts, new_id
from otel_rl.train.groups import await_in_store, stale_groups
from otel_rl.train.tasks import Task, task_for_group

if TYPE_CHECKING:
    from otel_rl.controller.backends import RolloutRunner
    from otel_rl.train.config import TrainConfig
    from otel_rl.train.resume import OnlineState
    from otel_rl.train.server_client import ServerClient


@dataclass
class _FinishedGroup:
    group_id: str
    results: list[RolloutResult]  # empty for a group found finished in the store at resume


class Collected(NamedTuple):
    """A step's groups, as collect() found them."""

    groups: list[str]
    stale: int  # groups dropped meanwhile, older than max_staleness
    # When the oldest of their final attempts started, and the newest commit of their status and call spans
    # (both None when a group was found finished at resume: its attempts are not known here).
    started_ns: int | None
    seen_through: int | None


def adoptable_groups(rollouts: list[Rollout], run_id: str, skip: set[str]) -> dict[str, list[Rollout]]:
    """The run's training rollouts left running, by group, without the groups in `skip` (trained on, or
    queued as finished: all their status spans are in the store already)."""
    groups: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        group_id = rollout.group_id
        if rollout.split == "train" and group_id.startswith(f"{run_id}-") and group_id not in skip:
            groups.setdefault(group_id, []).append(rollout)
    return groups


class GroupLauncher:
    """Launches groups of the run's tasks on `runner`; hands out finished, fresh-enough groups."""

    def __init__(
        self,
        config: TrainConfig,
        client: ServerClient,
        runner: RolloutRunner,
        tasks: list[Task],
        run_id: str,
        state: OnlineState,
    ) -> None:
        self.config, self.client, self.runner = config, client, runner
        self.tasks, self.run_id, self.state = tasks, run_id, state
        self._finished: asyncio.Queue[_FinishedGroup] = asyncio.Queue()
        self._room = asyncio.Condition()
        self._outstanding = 0
        self._group_tasks: set[asyncio.Task] = set()
        self._launching: asyncio.Task | None = None

    def start(self, reused: list[str]) -> None:
        """Queue the groups a previous run finished (`reused`), take back those it left running, then keep
        launching new ones."""
        for group_id in reused:
            self._finished.put_nowait(_FinishedGroup(group_id, []))
            self._outstanding += 1
        self._launching = asyncio.create_task(self._launch_groups(set(reused) | set(self.state.consumed)))

    async def collect(self, version: int) -> Collected:
        """B finished groups whose spans are all in the store, fresh enough to train policy `version`."""
        need = self.config.algorithm.groups_per_step
        chosen: list[str] = []
        starts: list[int | None] = []
        stale = 0
        seen: list[int | None] = []
        while len(chosen) < need:
            batch = [await self._next_finished()]
            while len(chosen) + len(batch) < need and not self._finished.empty():
                batch.append(self._finished.get_nowait())
            results = [r for group in batch for r in group.results]
            versions, seen_at = await await_in_store(self.client, results)
            seen.append(seen_at)
            stale_now = stale_groups(versions, version, self.config.algorithm.max_staleness)
            for group in batch:
                if group.group_id in stale_now:
                    stale += 1
                    await self.release(1)
                else:
                    chosen.append(group.group_id)
                    starts += [r.attempts[-1].start_time_unix_nano for r in group.results] or [None]
        return Collected(
            chosen, stale, None if None in starts else min(starts), None if None in seen else max(seen)
        )

    async def release(self, n_groups: int) -> None:
        """Make room for `n_groups` new groups: these were trained on or dropped."""
        async with self._room:
            self._outstanding -= n_groups
            self._room.notify_all()

    async def aclose(self) -> None:
        """Stop launching, cancel the groups running (their harnesses are stopped), close the runner."""
        running = [task for task in (self._launching, *self._group_tasks) if task is not None]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self.runner.aclose()

    async def _next_finished(self) -> _FinishedGroup:
        """The next finished group, or the launching task's error: once it failed, none would come."""
        assert self._launching is not None, "start() was not called"
        getting = asyncio.ensure_future(self._finished.get())
        try:
            await asyncio.wait({getting, self._launching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getting.done():
                getting.cancel()  # a queued group stays queued: get() takes it only when it returns
        if getting.done():
            return getting.result()
        self._launching.result()  # raises why it stopped
        raise RuntimeError("group launching stopped")  # it loops until cancelled: not reached

    async def _launch_groups(self, finished: set[str]) -> None:
        algo = self.config.algorithm
        adopted = adoptable_groups(await self.runner.in_flight(), self.run_id, finished)
        for group_id, rollouts in adopted.items():
            async with self._room:  # may pass the bound (with `reused`): new groups then wait
                self._outstanding += 1
            self._spawn(group_id, rollouts)
        bound = self.config.algorithm.max_outstanding_groups
        while True:
            async with self._room:
                await self._room.wait_for(lambda: self._outstanding < bound)
                self._outstanding += 1
            task = task_for_group(self.tasks, self.state.next_group, self.config.seed)
            self.state.next_group += 1
            group_id = f"{self.run_id}-{new_id()[:16]}"
            self._spawn(
                group_id, group_rollouts(task.task_id, task.payload, algo.group_size, group_id=group_id)
            )

    def _spawn(self, group_id: str, rollouts: list[Rollout]) -> None:
        running = asyncio.create_task(self._run_group(group_id, rollouts))
        self._group_tasks.add(running)
        running.add_done_callback(self._group_tasks.discard)

    async def _run_group(self, group_id: str, rollouts: list[Rollout]) -> None:
        results = await asyncio.gather(*(self.runner.run_rollout(rollout) for rollout in rollouts))
        await self._finished.put(_FinishedGroup(group_id, list(results)))
