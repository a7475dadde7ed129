"""Every read the system makes of its own store, as named functions returning polars frames.

The trainer's (its groups, resume, evaluation), the samples pipeline's, the web view's and the metrics' reads
all live here. Each takes `run(sql, params)`: the server's /v1/query (train/server_client.py),
`otel_rl.query`, or the store itself. Values are bound by DuckDB, never pasted into the SQL: the only text
joined into a statement is a name from a fixed list in this module or otel_rl/attributes.py (columns,
attribute keys, scope and span names).
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

# The web view's pages (ui/routes.py).
PAGE_ROLLOUT_COLUMNS = (
    "rollout_id",
    "split",
    "status",
    "outcome_reward",
    "group_id",
    "task_id",
    "started_at",
    "duration_ms",
    "n_calls",
    "n_error_calls",
    "service_name",
    "policy_version_min",
    "policy_version_max",
    "exit_code",
)
PAGE_CALL_COLUMNS = (
    "span_id",
    "trace_id",
    "parent_span_id",
    "started_at",
    "ended_at",
    "duration_ms",
    "request_model",
    "response_model",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "is_error",
    "error_type",
    "policy_version",
    "finish_reasons",
    "dialect",
    "input_messages",
    "output_messages",
)
# The figures of a training step span (otel_rl.train.<name>; records.StepRecord) the training page draws.
STEP_FIGURES = (
    "reward_mean",
    "success_rate",
    "rollouts",
    "samples",
    "sampled_tokens",
    "stale_groups",
    "screened",
    "collect_s",
    "transform_s",
    "train_s",
    "save_s",
    "reload_s",
    "paused_s",
    "drain_s",
    "wall_s",
    "transform_wait_s",
    "transform_read_s",
    "transform_build_s",
)
TRAINER_FIGURES = ("loss", "mismatch", "is_weight_mean", "grad_norm")
EVAL_FIGURES = ("reward_mean", "success_rate", "rollouts", "wall_s")
RELOAD_PHASES = ("drain", "pause", "reload", "verify", "resume", "total")

# Spans the server vouches for (`sender`, set at ingest): a rollout key can send spans in any scope, so the
# controller's, the gateway's and the trainer's records are read from these senders only, the latest by the
# server's receive order (`commit_seq`), never by a sender's clock.
_VOUCHED = f"sender IN ({', '.join(f'$sender{i}' for i in range(len(VOUCHED_SENDERS)))})"  # named
_VOUCHED_LISTED = f"sender IN ({', '.join('?' * len(VOUCHED_SENDERS))})"  # positional
_RECEIVED = "(commit_seq, start_time_unix_nano)"  # spans of one commit by their start
_ATTEMPT = f"attributes ->> '{attr.ATTEMPT_ID}'"
_GROUP = f"attributes ->> '{attr.GROUP_ID}'"


def _in(column: str, n: int) -> str:
    """`column IN (?, ...)`, n placeholders (none: no row)."""
    return f"{column} IN ({', '.join('?' * n) or 'NULL'})"


def _by_ids(ids: Sequence[str], read: Callable[[Sequence[str]], pl.DataFrame]) -> pl.DataFrame:
    """`read` of the ids, in chunks that stay within the bound on a statement's parameters, as one frame."""
    ids = list(ids)
    chunks = [ids[i : i + MAX_PARAMS // 2] for i in range(0, len(ids), MAX_PARAMS // 2)] or [[]]
    return pl.concat([read(chunk) for chunk in chunks], how="vertical_relaxed")


def _vouched(**named: object) -> dict[str, object]:
    """The named parameters of a statement with _VOUCHED, and `named`."""
    return {f"sender{i}": sender for i, sender in enumerate(VOUCHED_SENDERS)} | named


# ------------------------------------------------------------------------------------------ the online loop


def attempt_progress(run: Run, attempt_ids: Sequence[str], since_ns: int) -> pl.DataFrame:
    """Per attempt (all started at `since_ns` or later): whether its controller status span arrived
    (`finished`), and its oldest call's `policy_version`. The time bound lets DuckDB skip older row groups:
    without it every poll parsed every stored call's attributes."""
    sql = (
        f"SELECT attributes ->> '{attr.ATTEMPT_ID}' AS attempt_id,"
        f" bool_or(scope_name = '{attr.CONTROLLER_SCOPE}') AS finished,"
        f" min(TRY_CAST(attributes ->> '{attr.POLICY_VERSION}' AS INTEGER))"
        f" FILTER (WHERE scope_name = '{attr.GATEWAY_SCOPE}') AS policy_version"
        f" FROM spans WHERE start_time_unix_nano >= ? AND {_VOUCHED_LISTED}"
        f" AND scope_name IN ('{attr.CONTROLLER_SCOPE}', '{attr.GATEWAY_SCOPE}')"
        f" AND {_in(_ATTEMPT, len(attempt_ids))} GROUP BY 1"
    )
    return run(sql, [since_ns, *VOUCHED_SENDERS, *attempt_ids])


def final_attempts(run: Run, group_ids: Sequence[str], since_ns: int | None = None) -> pl.DataFrame:
    """Per rollout of the groups: its final attempt as the controller recorded it (`final_attempt`,
    `status`, `group_id`, `task_id`) and when it started (`attempt_start_ns`). With `since_ns` (before every
    final attempt's start), DuckDB skips the row groups written before."""
    sql = (
        f"SELECT attributes ->> '{attr.ROLLOUT_ID}' AS rollout_id,"
        f" arg_max(attributes ->> '{attr.ATTEMPT_ID}', {_RECEIVED}) AS final_attempt,"
        f" any_value(attributes ->> '{attr.GROUP_ID}') AS group_id,"
        f" any_value(attributes ->> '{attr.TASK_ID}') AS task_id,"
        f" arg_max(attributes ->> '{attr.ROLLOUT_STATUS}', {_RECEIVED}) AS status,"
        " max(start_time_unix_nano) AS attempt_start_ns"
        f" FROM spans WHERE scope_name = '{attr.CONTROLLER_SCOPE}' AND name = '{attr.ROLLOUT_SPAN_NAME}'"
        f" AND {_VOUCHED_LISTED}{'' if since_ns is None else ' AND start_time_unix_nano >= ?'}"
        f" AND {_in(_GROUP, len(group_ids))} GROUP BY 1"
    )
    since = [] if since_ns is None else [since_ns]
    return run(sql, [*VOUCHED_SENDERS, *since, *group_ids])


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


# ---------------------------------------------------------------------------------------------- the web view


def rollouts_page(
    run: Run,
    *,
    split: str | None = None,
    status: str | None = None,
    group: str | None = None,
    task: str | None = None,
    harness: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 200,
    offset: int = 0,
) -> pl.DataFrame:
    """One page of the rollouts table, newest first; one row more than `limit` says there are more. Each
    filter given narrows it (`harness`: the service name)."""
    conditions = {
        "split = $split": split,
        "status = $status": status,
        "group_id = $group": group,
        "task_id = $task": task,
        "service_name = $harness": harness,
        "outcome_reward >= $min_reward": min_reward,
        "outcome_reward <= $max_reward": max_reward,
        "started_at >= $since::TIMESTAMPTZ": since and since.isoformat(),
        "started_at <= $until::TIMESTAMPTZ": until and until.isoformat(),
    }
    used = {condition: value for condition, value in conditions.items() if value not in (None, "")}
    named = {condition.split("$")[1].split(":")[0]: value for condition, value in used.items()}
    sql = (
        f"SELECT {', '.join(PAGE_ROLLOUT_COLUMNS)}, epoch_ms(started_at) AS started_ms FROM rollouts"
        f" WHERE {' AND '.join(used) or 'true'}"
        " ORDER BY started_at DESC NULLS LAST, rollout_id LIMIT $limit OFFSET $offset"
    )
    return run(sql, {**named, "limit": limit + 1, "offset": offset})


def rollout(run: Run, rollout_id: str) -> pl.DataFrame:
    """The rollout's row of the `rollouts` view (none: no such rollout)."""
    return run(
        "SELECT *, epoch_ms(started_at) AS started_ms FROM rollouts WHERE rollout_id = $1", [rollout_id]
    )


def rollout_timeline_calls(run: Run, rollout_id: str) -> pl.DataFrame:
    """The rollout's model calls in time order, messages and usage included."""
    sql = (
        f"SELECT {', '.join(PAGE_CALL_COLUMNS)}, epoch_ms(started_at) AS started_ms,"
        " epoch_ms(ended_at) AS ended_ms FROM llm_calls WHERE rollout_id = $1"
        " ORDER BY start_time_unix_nano, span_id"
    )
    return run(sql, [rollout_id])


def rollout_tools(run: Run, rollout_id: str) -> pl.DataFrame:
    """The tool calls the rollout's model calls asked for, with the times of the tool spans that ran them."""
    sql = (
        "SELECT t.span_id, t.choice_index, t.tool_call_id, t.name, t.arguments, t.result, t.tool_span_id,"
        " (s.start_time_unix_nano // 1000000)::BIGINT AS started_ms,"
        " (s.end_time_unix_nano // 1000000)::BIGINT AS ended_ms"
        " FROM tool_calls t LEFT JOIN spans s ON s.trace_id = t.tool_trace_id AND s.span_id = t.tool_span_id"
        " WHERE t.rollout_id = $1"
    )
    return run(sql, [rollout_id])


def rollout_steps(run: Run, rollout_id: str) -> pl.DataFrame:
    """The rollout's agent steps in time order."""
    sql = (
        "SELECT span_id, parent_span_id, kind, agent_name, name, epoch_ms(started_at) AS started_ms,"
        " epoch_ms(ended_at) AS ended_ms, duration_ms, is_error"
        " FROM agent_steps WHERE rollout_id = $1 ORDER BY start_time_unix_nano"
    )
    return run(sql, [rollout_id])


def rollout_reward_rows(run: Run, rollout_id: str) -> pl.DataFrame:
    """The rollout's rewards in time order, every source."""
    sql = (
        "SELECT level, name, value, label, explanation, source, span_id, epoch_ms(time) AS time_ms"
        " FROM rewards WHERE rollout_id = $1 ORDER BY time"
    )
    return run(sql, [rollout_id])


def rollout_group(run: Run, rollout_id: str) -> tuple[int, str | None]:
    """How many spans the rollout has, and its group (span_identity: a seventh of the cost of `rollouts`)."""
    sql = (
        "SELECT count(*), any_value(group_id) FILTER (WHERE group_id IS NOT NULL)"
        " FROM span_identity WHERE rollout_id = $1"
    )
    return run(sql, [rollout_id]).row(0)


# The trainer's records and the gateway's reloads.
_TRAINER = f"scope_name = '{attr.TRAIN_SCOPE}' AND {_VOUCHED}"
_RUN = f"attributes ->> '{attr.TRAIN_RUN_ID}'"


def _chosen_run(run_id: str | None) -> str:
    """The statement's run: `$run`, else the latest (whose last record the server received last)."""
    latest = f"(SELECT arg_max({_RUN}, {_RECEIVED}) FROM spans WHERE {_TRAINER})"
    return f"{_RUN} = {'$run' if run_id else latest}"


def _run_named(run_id: str | None) -> dict[str, object]:
    return _vouched(run=run_id) if run_id else _vouched()


def _figure(key: str, name: str, kind: str = "DOUBLE") -> str:
    return f"TRY_CAST(attributes ->> '{key}' AS {kind}) AS {name}"


def training_runs(run: Run) -> pl.DataFrame:
    """The training runs the store recorded, the latest first."""
    sql = (
        f"SELECT {_RUN} AS run_id,"
        f" count(*) FILTER (WHERE name = '{attr.TRAIN_STEP_SPAN_NAME}') AS steps,"
        f" count(*) FILTER (WHERE name = '{attr.TRAIN_EVAL_SPAN_NAME}') AS evals,"
        " (min(start_time_unix_nano) // 1000000)::BIGINT AS started_ms,"
        " (max(end_time_unix_nano) // 1000000)::BIGINT AS last_ms"
        f" FROM spans WHERE {_TRAINER} GROUP BY 1 ORDER BY last_ms DESC"
    )
    return run(sql, _vouched())


def training_steps(run: Run, run_id: str | None) -> pl.DataFrame:
    """One row per optimizer step of a run (the latest when `run_id` is None), in step order."""
    figures = [_figure(attr.TRAIN_PREFIX + name, name) for name in STEP_FIGURES]
    figures += [_figure(f"{attr.TRAIN_PREFIX}trainer.{name}", name) for name in TRAINER_FIGURES]
    sql = (
        f"SELECT {_RUN} AS run_id, {_figure(attr.TRAIN_PREFIX + 'step', 'step', 'INTEGER')},"
        f" {_figure(attr.POLICY_VERSION, 'policy_version', 'INTEGER')},"
        f" {', '.join(figures)}, (end_time_unix_nano // 1000000)::BIGINT AS time_ms"
        f" FROM spans WHERE {_TRAINER} AND name = '{attr.TRAIN_STEP_SPAN_NAME}' AND {_chosen_run(run_id)}"
        " ORDER BY step, start_time_unix_nano"
    )
    return run(sql, _run_named(run_id))


def training_evals(run: Run, run_id: str | None) -> pl.DataFrame:
    """One row per evaluation of a run (each eval harness at each policy version), in step order."""
    figures = ", ".join(_figure(attr.TRAIN_PREFIX + name, name) for name in EVAL_FIGURES)
    sql = (
        f"SELECT attributes ->> '{attr.TRAIN_PREFIX}name' AS eval,"
        f" {_figure(attr.TRAIN_PREFIX + 'step', 'step', 'INTEGER')},"
        f" {_figure(attr.POLICY_VERSION, 'policy_version', 'INTEGER')},"
        f" {figures}, (end_time_unix_nano // 1000000)::BIGINT AS time_ms"
        f" FROM spans WHERE {_TRAINER} AND name = '{attr.TRAIN_EVAL_SPAN_NAME}' AND {_chosen_run(run_id)}"
        " ORDER BY step, eval"
    )
    return run(sql, _run_named(run_id))


def reloads(run: Run, since_ms: int | None) -> pl.DataFrame:
    """The gateway's weight reloads (each phase in ms), since a time (a training run's start) if given."""
    phases = ", ".join(_figure(f"otel_rl.reload.{phase}_ms", f"{phase}_ms") for phase in RELOAD_PHASES)
    sql = (
        f"SELECT {_figure(attr.POLICY_VERSION, 'policy_version', 'INTEGER')}, {phases},"
        " status_code = 2 AS failed, (start_time_unix_nano // 1000000)::BIGINT AS time_ms"
        f" FROM spans WHERE name = '{attr.RELOAD_SPAN_NAME}' AND {_VOUCHED}"
        f"{'' if since_ms is None else ' AND start_time_unix_nano >= $since_ns'}"
        " ORDER BY start_time_unix_nano"
    )
    return run(sql, _vouched() if since_ms is None else _vouched(since_ns=int(since_ms) * 1_000_000))


def step_rollout_versions(run: Run, run_id: str | None) -> pl.DataFrame:
    """Per step of a run and rollout of its groups: the `policy_version` the step span records (the version
    the step produced) and the rollout's oldest call's version (`policy_version_min`)."""
    sql = (
        "WITH step_groups AS ("
        f" SELECT {_figure(attr.TRAIN_PREFIX + 'step', 'step', 'INTEGER')},"
        f" {_figure(attr.POLICY_VERSION, 'policy_version', 'INTEGER')},"
        f" unnest(TRY_CAST(attributes -> '{attr.TRAIN_PREFIX}group_ids' AS VARCHAR[])) AS group_id"
        f" FROM spans WHERE {_TRAINER} AND name = '{attr.TRAIN_STEP_SPAN_NAME}' AND {_chosen_run(run_id)})"
        " SELECT s.step, s.policy_version, r.policy_version_min"
        " FROM step_groups s JOIN rollouts r USING (group_id) ORDER BY s.step"
    )
    return run(sql, _run_named(run_id))


# --------------------------------------------------------------------------------------------- the metrics


def table_rows(run: Run) -> pl.DataFrame:
    """DuckDB's own row count of each store table (kept per table, exact without deletes): reads no rows."""
    sql = (
        "SELECT table_name, estimated_size FROM duckdb_tables()"
        " WHERE database_name = $1 AND schema_name IN ('main', 'normalized') ORDER BY table_name"
    )
    return run(sql, [CATALOG])
