"""Every read the trainer makes of its own store, as named functions returning polars frames.

The online loop's (its groups, resume, evaluation), the samples pipeline's and the metrics' reads live here,
the web view's in ui_reads.py: no other module queries the store. Each takes `run(sql, params)`: the
server's /v1/query (train/server_client.py), `otel_rl.query`, or the store itself. Values are bound by
DuckDB, never pasted into the SQL: the only text joined into a statement is a name from a fixed list in
these modules or otel_rl/attributes.py (columns, attribute keys, scope and span names). A record's rollout
identity is read from the raw tables' identity columns, resolved once at ingest (store/identity.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import polars as pl

from otel_rl import attributes as attr
from otel_rl.store.connection import CATALOG
from otel_rl.store.layout import VOUCHED_SENDERS
from otel_rl.store.sandbox import MAX_PARAMS, Params

Run = Callable[[str, Params | None], pl.DataFrame]

# The samples pipeline's reads (transforms/samples.py): only the columns it uses.
ROLLOUT_COLUMNS = ("rollout_id", "attempt_id", "group_id", "task_id", "status")
CALL_COLUMNS = (
    "rollout_id",
    "span_id",
    "start_time_unix_nano",
    "is_error",
    "finish_reasons",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "logprobs_source",
    "policy_version",
)
# Read only when needed (retokenizing, drift, SFT): the messages are most of a call's bytes.
MESSAGE_COLUMNS = ("input_messages", "output_messages", "tool_definitions")
REWARD_COLUMNS = ("rollout_id", "span_id", "level", "name", "value", "source", "time", "received_at", "seq")
FLAGS_COLUMN = "hack_detectors"  # the rollout's detectors (a list), null when none flagged it

# Spans the server vouches for (`sender`, set at ingest): a rollout key can send spans in any scope, so the
# controller's, the gateway's and the trainer's records are read from these senders only, the latest by the
# server's receive order (`commit_seq`), never by a sender's clock.
VOUCHED = f"sender IN ({', '.join(f'$sender{i}' for i in range(len(VOUCHED_SENDERS)))})"  # named
_VOUCHED_LISTED = f"sender IN ({', '.join('?' * len(VOUCHED_SENDERS))})"  # positional
RECEIVED = "(commit_seq, start_time_unix_nano)"  # spans of one commit by their start


def _in(column: str, n: int) -> str:
    """`column IN (?, ...)`, n placeholders (none: no row)."""
    return f"{column} IN ({', '.join('?' * n) or 'NULL'})"


def _by_ids(ids: Sequence[str], read: Callable[[Sequence[str]], pl.DataFrame]) -> pl.DataFrame:
    """`read` of the ids, in chunks that stay within the bound on a statement's parameters, as one frame."""
    ids = list(ids)
    chunks = [ids[i : i + MAX_PARAMS // 2] for i in range(0, len(ids), MAX_PARAMS // 2)] or [[]]
    return pl.concat([read(chunk) for chunk in chunks], how="vertical_relaxed")


def vouched(**named: object) -> dict[str, object]:
    """The named parameters of a statement with VOUCHED, and `named`."""
    return {f"sender{i}": sender for i, sender in enumerate(VOUCHED_SENDERS)} | named


# ------------------------------------------------------------------------------------------ the online loop


def attempt_progress(run: Run, attempt_ids: Sequence[str], since_ns: int) -> pl.DataFrame:
    """Per attempt (all started at `since_ns` or later): whether its controller status span arrived
    (`finished`), its oldest call's `policy_version`, and the newest commit of its status and call spans
    (`commit_seq`: a read of its normalized rows waits for that commit, not for the ones other rollouts made
    since). The time bound lets DuckDB skip older row groups: without it every poll parsed every stored
    call's attributes."""
    sql = (
        "SELECT attempt_id,"
        " bool_or(scope_name = ?) AS finished,"
        f" min(TRY_CAST(attributes ->> '{attr.POLICY_VERSION}' AS INTEGER))"
        " FILTER (WHERE scope_name = ?) AS policy_version, max(commit_seq) AS commit_seq"
        f" FROM spans WHERE start_time_unix_nano >= ? AND {_VOUCHED_LISTED}"
        " AND scope_name IN (?, ?)"
        f" AND {_in('attempt_id', len(attempt_ids))} GROUP BY 1"
    )
    scopes = [attr.CONTROLLER_SCOPE, attr.GATEWAY_SCOPE]
    return run(sql, [*scopes, since_ns, *VOUCHED_SENDERS, *scopes, *attempt_ids])


def await_normalized(run: Run) -> None:
    """An empty read of the normalized tables (`llm_calls`, which a step reads): with a `run` that waits for
    a commit (ServerClient.query's `after_commit`), it returns once they include that commit, so that the
    wait for normalizing is timed apart from the reads."""
    run("SELECT 1 FROM llm_calls LIMIT 0", None)


def final_attempts(run: Run, group_ids: Sequence[str], since_ns: int | None = None) -> pl.DataFrame:
    """Per rollout of the groups: its final attempt as the controller recorded it (`final_attempt`,
    `status`, `group_id`, `task_id`) and when it started (`attempt_start_ns`). With `since_ns` (before every
    final attempt's start), DuckDB skips the row groups written before."""
    sql = (
        f"SELECT rollout_id, arg_max(attempt_id, {RECEIVED}) AS final_attempt,"
        " any_value(group_id) AS group_id, any_value(task_id) AS task_id,"
        f" arg_max(attributes ->> '{attr.ROLLOUT_STATUS}', {RECEIVED}) AS status,"
        " max(start_time_unix_nano) AS attempt_start_ns"
        " FROM spans WHERE scope_name = ? AND name = ?"
        f" AND {_VOUCHED_LISTED}{'' if since_ns is None else ' AND start_time_unix_nano >= ?'}"
        f" AND {_in('group_id', len(group_ids))} GROUP BY 1"
    )
    since = [] if since_ns is None else [since_ns]
    span = [attr.CONTROLLER_SCOPE, attr.ROLLOUT_SPAN_NAME]
    return run(sql, [*span, *VOUCHED_SENDERS, *since, *group_ids])


def group_gateway_calls(run: Run, group_ids: Sequence[str], since_ns: int) -> pl.DataFrame:
    """The gateway's calls of the groups started at `since_ns` or later (the policy's, with exact token ids),
    by rollout in time order: CALL_COLUMNS and `attempt_id`."""
    sql = (
        f"SELECT {', '.join(CALL_COLUMNS)}, attempt_id FROM llm_calls WHERE start_time_unix_nano >= ?"
        f" AND dialect = 'gateway' AND {_in('group_id', len(group_ids))}"
        " ORDER BY rollout_id, start_time_unix_nano"
    )
    return run(sql, [since_ns, *group_ids])


def received_rewards(run: Run, rollout_ids: Sequence[str], since: datetime) -> pl.DataFrame:
    """The rewards of the rollouts the server received at `since` or later."""
    sql = (
        f"SELECT * FROM rewards WHERE received_at >= ?::TIMESTAMPTZ AND {_in('rollout_id', len(rollout_ids))}"
    )
    return run(sql, [since.isoformat(), *rollout_ids])


def run_train_rollouts(run: Run, run_id: str) -> pl.DataFrame:
    """The train rollouts of an online run (its group ids start with the run id): group, status, end, the
    oldest policy version of their calls."""
    sql = (
        "SELECT group_id, status, ended_at, policy_version_min FROM rollouts"
        " WHERE split = 'train' AND starts_with(group_id, $1 || '-')"
    )
    return run(sql, [run_id])


def group_rollout_ids(run: Run, group_id: str) -> pl.DataFrame:
    """The rollout ids of one group."""
    return run("SELECT rollout_id FROM rollouts WHERE group_id = $1", [group_id])


def group_rewards(run: Run, group_id: str) -> pl.DataFrame:
    """Every reward of one group's rollouts."""
    sql = "SELECT * FROM rewards WHERE rollout_id IN (SELECT rollout_id FROM rollouts WHERE group_id = $1)"
    return run(sql, [group_id])


# ------------------------------------------------------------------------------------- the samples pipeline


def selected_rollouts(run: Run, where: str, params: Params | None = None) -> pl.DataFrame:
    """The rollouts matching `where`, a SQL predicate over the `rollouts` view the user wrote (`otel-rl
    export --where`, a training config's), its parameters in `params`: ROLLOUT_COLUMNS and `n_calls`."""
    return run(f"SELECT {', '.join(ROLLOUT_COLUMNS)}, n_calls FROM rollouts WHERE ({where})", params)


def rollout_calls(run: Run, rollout_ids: Sequence[str], *, messages: bool = False) -> pl.DataFrame:
    """The rollouts' model calls (CALL_COLUMNS, and MESSAGE_COLUMNS with `messages`), by rollout in time
    order. The ids are bound as a list of values, with which DuckDB filters the scans."""
    columns = ", ".join(CALL_COLUMNS + MESSAGE_COLUMNS if messages else CALL_COLUMNS)
    return _by_ids(
        sorted(rollout_ids),
        lambda ids: run(
            f"SELECT {columns} FROM llm_calls WHERE {_in('rollout_id', len(ids))}"
            " ORDER BY rollout_id, start_time_unix_nano, span_id",
            list(ids),
        ),
    )


def rollout_rewards(run: Run, rollout_ids: Sequence[str]) -> pl.DataFrame:
    """The rollouts' rewards (REWARD_COLUMNS)."""
    sql = f"SELECT {', '.join(REWARD_COLUMNS)} FROM rewards WHERE "
    return _by_ids(rollout_ids, lambda ids: run(sql + _in("rollout_id", len(ids)), list(ids)))


def hack_flags(run: Run, rollout_ids: Sequence[str]) -> pl.DataFrame:
    """The `hack_flags` rows of the rollouts: `rollout_id` and their detectors (FLAGS_COLUMN)."""
    sql = f"SELECT rollout_id, detectors AS {FLAGS_COLUMN} FROM hack_flags WHERE "
    return _by_ids(rollout_ids, lambda ids: run(sql + _in("rollout_id", len(ids)), list(ids)))


# ---------------------------------------------------------------------------------- the coding environment


def probe_outcomes(run: Run, probe_id: str | None) -> pl.DataFrame:
    """One row a task (`task_id`): its probes (rollouts with a trusted reward; infrastructure failures have
    none), `passes`, and `flagged_passes` (passes of rollouts a detector flagged, hack_flags): of one probe
    run's rollouts (`otel-rl tasks probe --probe-id`: its groups are `<probe_id>-...`), or of every rollout
    of the task when `probe_id` is None. Curation (coding/curate.py) selects on it."""
    sql = (
        "SELECT r.task_id, count(*) AS probes,"
        " count(*) FILTER (WHERE r.outcome_reward >= 1) AS passes,"
        " count(*) FILTER (WHERE r.outcome_reward >= 1 AND f.rollout_id IS NOT NULL) AS flagged_passes"
        " FROM rollouts r LEFT JOIN hack_flags f USING (rollout_id)"
        " WHERE r.task_id IS NOT NULL AND r.outcome_reward IS NOT NULL"
        " AND starts_with(coalesce(r.group_id, ''), $group_prefix)"
        " GROUP BY r.task_id ORDER BY r.task_id"
    )
    return run(sql, {"group_prefix": f"{probe_id}-" if probe_id else ""})


def demo_train_rollouts(run: Run) -> pl.DataFrame:
    """Every train rollout of the coding demo (its group, id, status): the weak grader's verdict (`proxy`,
    the harness's pytest exit status), the truth (`truth`, the grader's hidden tests, outside the sandbox)
    and the detectors that flagged it (`detectors`, `evidence` as JSON)."""
    sql = (
        "SELECT r.group_id, r.rollout_id, r.status,"
        " r.outcome_rewards_by_source['harness'] AS proxy, r.outcome_rewards_by_source['grader'] AS truth,"
        " f.detectors, to_json(f.evidence) AS evidence"
        " FROM rollouts r LEFT JOIN hack_flags f USING (rollout_id)"
        " WHERE r.split = 'train' AND r.group_id IS NOT NULL"
    )
    return run(sql, None)


# --------------------------------------------------------------------------------------------- the metrics


def table_rows(run: Run) -> pl.DataFrame:
    """DuckDB's own row count of each store table (kept per table, exact without deletes): reads no rows."""
    sql = (
        "SELECT table_name, estimated_size FROM duckdb_tables()"
        " WHERE database_name = $1 AND schema_name IN ('main', 'normalized') ORDER BY table_name"
    )
    return run(sql, [CATALOG])
