"""A step's batch: B finished, fresh groups → samples, collected again when a batch of groups gives none."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import polars as pl
from rich.console import Console

from otel_rl.store import reads
from otel_rl.train.config import TrainConfig
from otel_rl.train.groups import read_groups
from otel_rl.train.launcher import Collected, GroupLauncher
from otel_rl.train.server_client import OnlineTrainingError, ServerClient

EMPTY_ROUNDS = 3  # batches of groups in a row without a sample before the loop gives up


@dataclass(frozen=True)
class TransformTimes:
    """A step's transform in parts (seconds): what grows with the run shows in which part."""

    wait_s: float  # until the normalized tables included the groups' newest status or call span
    read_s: float  # the groups' rows, read from the store
    build_s: float  # samples built from them (build_samples)


@dataclass
class StepBatch:
    groups: list[str]  # the groups trained on
    samples: pl.DataFrame
    report: Any  # otel_rl.transforms.samples' report: tokens, what was dropped and why
    stale_groups: int  # dropped on the way, older than max_staleness
    collect_s: float  # of the last round of collection
    transform_s: float
    transform: TransformTimes  # transform_s in parts
    ready_at: float  # when its samples were built (time.monotonic)


async def collect_batch(
    config: TrainConfig,
    client: ServerClient,
    launcher: GroupLauncher,
    version: int,
    show: Callable[[str], None],
    console: Console,
) -> StepBatch:
    """The samples of B groups fresh enough for policy `version`; the groups stay outstanding until the
    caller releases them (after the update), those of empty rounds are released here."""
    from otel_rl.transforms.rewards import trust_setting

    stale_total = 0
    for _ in range(EMPTY_ROUNDS):
        show(f"collecting {config.algorithm.groups_per_step} groups")
        collect_started = time.monotonic()
        found = await launcher.collect(version)
        groups = found.groups
        stale_total += found.stale
        collected = time.monotonic()
        show("building samples")
        samples, report, times = await asyncio.to_thread(group_samples, config, client, found, version)
        transformed = time.monotonic()
        why = report.why_dropped(trust_setting)  # the senders' text: printed without rich markup
        if report.untrusted_rewards or not samples.height:
            console.print(f"{len(groups)} groups gave {samples.height} samples: {why}", markup=False)
        if samples.height:
            return StepBatch(
                groups,
                samples,
                report,
                stale_total,
                collected - collect_started,
                transformed - collected,
                times,
                transformed,
            )
        await launcher.release(len(groups))
    raise OnlineTrainingError(
        f"three batches of groups in a row gave no samples ({why}); see the `rollouts` view and "
        f"the harness logs in {config.output_dir / 'rollouts'}"
    )


def group_samples(
    config: TrainConfig, client: ServerClient, found: Collected, version: int
) -> tuple[pl.DataFrame, Any, TransformTimes]:
    """The samples of the groups' final attempts for an update of policy `version` (exact token ids: no
    tokenizer needed). The normalized tables are read once they include the groups' newest status or call
    span (launcher.Collected.seen_through), not every commit the next groups made since."""
    from otel_rl.transforms.samples import SampleOptions, build_samples

    started = time.perf_counter()
    query = partial(client.query, after_commit=found.seen_through)
    reads.await_normalized(query)  # until the normalized tables include the groups' newest spans
    waited = time.perf_counter()
    screening = config.algorithm.screen_flagged  # without their flags, the rollouts are all kept
    calls, rollouts, rewards = read_groups(query, found.groups, found.started_ns, flags=screening)
    options = SampleOptions(
        reward=config.reward.spec(),
        estimator=config.algorithm.advantage_estimator,
        current_policy_version=version,
        max_staleness=config.algorithm.max_staleness,
    )
    read = time.perf_counter()
    samples, report = build_samples(calls, rollouts, rewards, options=options)
    times = TransformTimes(waited - started, read - waited, time.perf_counter() - read)
    return samples, report, times
