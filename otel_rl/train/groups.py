"""What the store says about the online loop's groups: final attempts, policy versions, reuse."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import polars as pl

from otel_rl.store import reads
from otel_rl.train.server_client import OnlineTrainingError
from otel_rl.transforms.staleness import fresh

if TYPE_CHECKING:
    from otel_rl.controller import RolloutResult
    from otel_rl.train.server_client import ServerClient

STORE_WAIT_S = 120.0  # how long a finished rollout's spans may take to reach the store
POLL_S = 0.2

# Reads of a step's attempts start this long before the oldest of them: clocks of other hosts (Kubernetes
# pods) may run a little behind the controller's. Earlier rows are only read, not used.
CLOCK_SLACK_NS = 5_000_000_000


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


def stale_groups(versions: Mapping[str, int | None], trained: int, max_staleness: int) -> set[str]:
    """The groups (by their oldest call's version, `versions`) too stale to train policy version `trained`
    (the staleness rule: transforms/staleness.py)."""
    frame = pl.DataFrame(
        {"group_id": list(versions), "version": list(versions.values())},
        schema={"group_id": pl.String, "version": pl.Int64},
    )
    return set(frame.filter(~fresh(pl.col("version"), trained, max_staleness))["group_id"])


def reusable_groups(
    rollouts: pl.DataFrame, *, consumed: set[str], group_size: int, trained: int, max_staleness: int
) -> list[str]:
    """Groups a previous run of this loop finished but never trained on, still fresh enough to train policy
    version `trained`.

    `rollouts` are this run's train rows of the `rollouts` view (one per rollout, its final attempt). A group
    qualifies when all its `group_size` rollouts finished and its oldest call is fresh (staleness.py).
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
            & fresh(pl.col("version"), trained, max_staleness)
            & ~pl.col("group_id").is_in(sorted(consumed))
        )
        .sort("ended_at")
    )
    return groups["group_id"].to_list()


def read_groups(
    run: reads.Run, groups: Sequence[str], started_ns: int | None = None, *, flags: bool = True
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The calls, rollouts and rewards of the groups' final attempts (`run` asks the server); `started_ns`:
    when the oldest of those attempts started, when the caller knows it; `flags`: the rollouts with their
    detectors (FLAGS_COLUMN, for screening), the largest of the reads.

    Calls and rewards come from `llm_calls` and `rewards`, the views users query (tables the store keeps
    normalized). Everything read started or arrived after the oldest final attempt did: bounding the reads by
    that time lets DuckDB skip the row groups written before, so that a step reads what it needs whatever
    the store holds.
    """
    from otel_rl.transforms.screening import with_flags

    bound = None if started_ns is None else started_ns - CLOCK_SLACK_NS
    attempts = reads.final_attempts(run, groups, bound)
    rollouts = attempts.select(
        "rollout_id", pl.col("final_attempt").alias("attempt_id"), "group_id", "task_id", "status"
    )
    since = int(attempts["attempt_start_ns"].min()) - CLOCK_SLACK_NS
    # The policy's calls are the gateway's, with exact token ids; a harness's calls to any other model
    # are not samples of the policy.
    calls = reads.group_gateway_calls(run, groups, since)
    received = datetime.fromtimestamp(since / 1e9, UTC)
    rewards = reads.received_rewards(run, rollouts["rollout_id"].to_list(), received)
    calls, rewards = final_attempts_only(calls, rewards, attempts)
    return calls, with_flags(rollouts, run) if flags else rollouts, rewards


async def await_in_store(
    client: ServerClient, results: Sequence[RolloutResult]
) -> tuple[dict[str, int | None], int | None]:
    """Wait until the store has the status span of every final attempt; the groups' oldest versions, and
    the newest commit of those attempts' status and call spans (None without attempts): reads of their
    normalized rows wait for that commit only, not for the ones the rollouts still running made since,
    which cost the step a normalizing round of their own (ServerClient.query's `after_commit`).

    The controller exports an attempt's span after its harness exited, so by then the harness's own
    spans and rewards (exported before it exits) and a grader's reward (posted before the span ends,
    controller/coding.py) are in the store, at earlier commits.
    """
    finals = {r.attempts[-1].attempt_id: r.rollout.group_id for r in results}
    if not finals:
        return {}, None
    since = min(r.attempts[-1].start_time_unix_nano for r in results) - CLOCK_SLACK_NS
    deadline = time.monotonic() + STORE_WAIT_S
    while True:
        rows = await asyncio.to_thread(reads.attempt_progress, client.query, sorted(finals), since)
        missing = set(finals) - set(rows.filter(pl.col("finished"))["attempt_id"])
        if not missing:
            return oldest_versions(rows, finals), int(rows["commit_seq"].max())
        if time.monotonic() > deadline:
            raise OnlineTrainingError(
                f"{len(missing)} finished rollouts have no status in the store after "
                f"{STORE_WAIT_S:.0f} s: does {client.url} receive the controller's spans?"
            )
        await asyncio.sleep(POLL_S)
