"""Re-probing during online training (`controller.coding.reprobe_every`): every N steps, k probes a coding
task with the policy just loaded, then the groups to come draw from the tasks curation keeps."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from rich.console import Console

from otel_rl.coding.curate import Curation, curate
from otel_rl.coding.tasks import load_tasks
from otel_rl.store import reads
from otel_rl.train.groups import await_in_store
from otel_rl.train.probe import probe_rollouts, run_probes
from otel_rl.train.tasks import Task

if TYPE_CHECKING:
    from otel_rl.controller.backends import RolloutRunner
    from otel_rl.train.config import TrainConfig
    from otel_rl.train.server_client import ServerClient


def reprobe_due(config: TrainConfig, step: int) -> bool:
    """Whether the step just done is one after which the tasks are probed again."""
    coding = config.controller.coding
    return coding is not None and coding.reprobe_every > 0 and step % coding.reprobe_every == 0


def probe_id_of(run_id: str, step: int) -> str:
    """The probe run after `step` of a training run: its groups are `<run_id>-probe<step>-...`."""
    return f"{run_id}-probe{step}"


async def reprobe(
    config: TrainConfig,
    client: ServerClient,
    runner: RolloutRunner,
    tasks: list[Task],
    *,
    run_id: str,
    step: int,
) -> tuple[list[Task], Curation]:
    """Probe the training tasks (`tasks`, whose ids are the coding file's instance ids) `probe_k` times each
    on `runner`, curate by those probes' grader rewards, and return the training tasks curation keeps (in
    their order; all of `tasks` when it keeps none, for the run cannot train on nothing)."""
    coding = config.controller.coding
    assert coding is not None, "reprobe_due() is false without a coding section"
    ids = {task.task_id for task in tasks}
    coding_tasks = [task for task in load_tasks(coding.tasks).tasks if task.instance_id in ids]
    probe_id = probe_id_of(run_id, step)
    results = await run_probes(runner, probe_rollouts(coding_tasks, coding.probe_k, probe_id))
    await await_in_store(client, results)
    outcomes = await asyncio.to_thread(reads.probe_outcomes, client.query, probe_id)
    chosen = curate(
        coding_tasks, outcomes, always_fail_share=coding.always_fail_share, eval_repos=set(), seed=config.seed
    )
    kept = {task.instance_id for task in chosen.selected}
    return [task for task in tasks if task.task_id in kept] or tasks, chosen


def report(console: Console, step: int, tasks: list[Task], chosen: Curation) -> None:
    """One line after a re-probe: how many tasks train from now on, and why the others do not."""
    counts = (
        f"{len(chosen.mixed)} mixed, {len(chosen.always_fail)} always failing, {len(chosen.audit)} to audit, "
        f"{len(chosen.dropped)} dropped"
    )
    kept = len(chosen.selected)
    what = f"{kept} of {len(tasks)} tasks train" if kept else f"none kept, all {len(tasks)} tasks still train"
    console.print(f"re-probed after step {step}: {what} ({counts})")
