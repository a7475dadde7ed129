"""What the store says about the online loop's groups: final attempts, policy versions, reuse."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import polars as pl

from otel_rl import attributes as attr
from otel_rl.query import sql_list
from otel_rl.store.layout import VOUCHED_SENDERS
from otel_rl.train.server_client import OnlineTrainingError

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
# (the `rollouts` view has one row per rollout) or only a few fields cheaply, while rollouts run: only those
# the server vouches for (`sender`, set at ingest), since a rollout key can send spans in any scope; the
# latest by the server's receive order (`commit_seq`), never by a sender's clock.
_VOUCHED = f"sender IN {sql_list(VOUCHED_SENDERS)}"
_RECEIVED = "(commit_seq, start_time_unix_nano)"  # spans of one commit by their start


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
        f"AND scope_name IN ('{attr.CONTROLLER_SCOPE}', '{attr.GATEWAY_SCOPE}') AND {_VOUCHED} "
        f"AND attributes ->> '{attr.ATTEMPT_ID}' IN {sql_list(attempt_ids)} GROUP BY 1"
    )


def final_attempts_sql(group_ids: Sequence[str], since_ns: int | None = None) -> str:
    """Per rollout of the groups: its final attempt as the controller recorded it, and when it started. With
    `since_ns` (before every final attempt's start), DuckDB skips the row groups written before."""
    started = f"AND start_time_unix_nano >= {since_ns} " if since_ns is not None else ""
    return (
        f"SELECT attributes ->> '{attr.ROLLOUT_ID}' AS rollout_id, "
        f"arg_max(attributes ->> '{attr.ATTEMPT_ID}', {_RECEIVED}) AS final_attempt, "
        f"any_value(attributes ->> '{attr.GROUP_ID}') AS group_id, "
        f"any_value(attributes ->> '{attr.TASK_ID}') AS task_id, "
        f"arg_max(attributes ->> '{attr.ROLLOUT_STATUS}', {_RECEIVED}) AS status, "
        "max(start_time_unix_nano) AS attempt_start_ns "
        f"FROM spans WHERE scope_name = '{attr.CONTROLLER_SCOPE}' AND name = '{attr.ROLLOUT_SPAN_NAME}' "
        f"AND {_VOUCHED} {started}AND attributes ->> '{attr.GROUP_ID}' IN {sql_list(group_ids)} GROUP BY 1"
    )


def read_groups(
    query: Callable[[str], pl.DataFrame], groups: Sequence[str], started_ns: int | None = None
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The calls, rollouts and rewards of the groups' final attempts (`query` asks the server); `started_ns`:
    when the oldest of those attempts started, when the caller knows it.

    Calls and rewards come from `llm_calls` and `rewards`, the views users query (tables the store keeps
    normalized). Everything read started or arrived after the oldest final attempt did: bounding the reads by
    that time lets DuckDB skip the row groups written before, so that a step reads what it needs whatever
    the store holds.
    """
    from otel_rl.transforms.samples import CALL_COLUMNS
    from otel_rl.transforms.screening import with_flags

    bound = None if started_ns is None else started_ns - CLOCK_SLACK_NS
    attempts = query(final_attempts_sql(groups, bound))
    rollouts = attempts.select(
        "rollout_id", pl.col("final_attempt").alias("attempt_id"), "group_id", "task_id", "status"
    )
    since = int(attempts["attempt_start_ns"].min()) - CLOCK_SLACK_NS
    # The policy's calls are the gateway's, with exact token ids; a harness's calls to any other model
    # are not samples of the policy.
    calls = query(
        f"SELECT {', '.join(CALL_COLUMNS)}, attempt_id FROM llm_calls WHERE start_time_unix_nano >= {since}"
        f" AND dialect = 'gateway' AND group_id IN {sql_list(groups)}"
        " ORDER BY rollout_id, start_time_unix_nano"
    )
    received = datetime.fromtimestamp(since / 1e9, UTC).isoformat()
    rewards = query(
        f"SELECT * FROM rewards WHERE received_at >= '{received}'::TIMESTAMPTZ"
        f" AND rollout_id IN {sql_list(rollouts['rollout_id'].to_list())}"
    )
    calls, rewards = final_attempts_only(calls, rewards, attempts)
    return calls, with_flags(rollouts, query), rewards


async def await_in_store(
    client: ServerClient, results: Sequence[RolloutResult]
) -> tuple[dict[str, int | None], int | None]:
    """Wait until the store has the status span of every final attempt; the groups' oldest versions, and a
    commit those spans were written at or before (None without attempts): reads of their normalized rows
    need wait for no later one (ServerClient.query_seen).

    The controller exports an attempt's span after its harness exited, so by then the harness's own
    spans and rewards (exported before it exits) and the gateway's call spans are in the store too.
    """
    finals = {r.attempts[-1].attempt_id: r.rollout.group_id for r in results}
    if not finals:
        return {}, None
    since = min(r.attempts[-1].start_time_unix_nano for r in results) - CLOCK_SLACK_NS
    deadline = time.monotonic() + STORE_WAIT_S
    while True:
        rows, seen = await asyncio.to_thread(client.query_seen, attempt_progress_sql(sorted(finals), since))
        missing = set(finals) - set(rows.filter(pl.col("finished"))["attempt_id"])
        if not missing:
            return oldest_versions(rows, finals), seen
        if time.monotonic() > deadline:
            raise OnlineTrainingError(
                f"{len(missing)} finished rollouts have no status in the store after "
                f"{STORE_WAIT_S:.0f} s: does {client.url} receive the controller's spans?"
            )
        await asyncio.sleep(POLL_S)
