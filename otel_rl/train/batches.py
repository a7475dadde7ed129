"""A step's batch: B finished, fresh groups → samples, collected again when a batch of groups gives none."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl
from rich.console import Console

from otel_rl.train.config import TrainConfig
from otel_rl.train.groups import read_groups
from otel_rl.train.launcher import GroupLauncher
from otel_rl.train.server_client import OnlineTrainingError, ServerClient

EMPTY_ROUNDS = 3  # batches of groups in a row without a sample before the loop gives up


@dataclass
class StepBatch:
    groups: list[str]  # the groups trained on
    samples: pl.DataFrame
    report: Any  # otel_rl.transforms.samples' report: tokens, what was dropped and why
    stale_groups: int  # dropped on the way, older than max_staleness
    collect_s: float  # of the last round of collection
    transform_s: float


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
        groups, stale, started_ns = await launcher.collect(version)
        stale_total += stale
        collected = time.monotonic()
        show("building samples")
        samples, report = await asyncio.to_thread(group_samples, config, client, groups, started_ns, version)
        transformed = time.monotonic()
        why = report.why_dropped(trust_setting)  # the senders' text: printed without rich markup
        if report.untrusted_rewards or not samples.height:
            console.print(f"{len(groups)} groups gave {samples.height} samples: {why}", markup=False)
        if samples.height:
            return StepBatch(
                groups, samples, report, stale_total, collected - collect_started, transformed - collected
            )
        await launcher.release(len(groups))
    raise OnlineTrainingError(
        f"three batches of groups in a row gave no samples ({why}); see the `rollouts` view and "
        f"the harness logs in {config.output_dir / 'rollouts'}"
    )


def group_samples(
    config: TrainConfig, client: ServerClient, groups: list[str], started_ns: int | None, version: int
) -> tuple[pl.DataFrame, Any]:
    """The samples of the groups' final attempts (the oldest started at `started_ns`, when known) for an
    update of policy `version` (exact token ids: no tokenizer needed)."""
    from otel_rl.transforms.samples import SampleOptions, build_samples

    calls, rollouts, rewards = read_groups(client.query, groups, started_ns)
    options = SampleOptions(
        reward=config.reward.spec(),
        estimator=config.algorithm.advantage_estimator,
        current_policy_version=version,
        max_staleness=config.algorithm.max_staleness,
    )
    return build_samples(calls, rollouts, rewards, options=options)
