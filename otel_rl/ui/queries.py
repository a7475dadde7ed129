"""The SQL behind each page of the web view, over the normalized views (docs/views.md), as pure functions."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from otel_rl import attributes as attr
from otel_rl.input_rules import MAX_ID_CHARS  # rollout, group, task and run ids (HTTP 422 if longer)
from otel_rl.query import sql_list
from otel_rl.store.layout import VOUCHED_SENDERS

ROLLOUT_COLUMNS = (
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
CALL_COLUMNS = (
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


def literal(value: str) -> str:
    """A SQL string literal (DuckDB strings have no backslash escapes: doubling the quote is enough)."""
    return "'" + value.replace("'", "''") + "'"


class RolloutFilter(BaseModel):
    """The rollouts table's filters (each optional), as query parameters."""

    split: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    status: str | None = Field(default=None, max_length=64)
    min_reward: float | None = Field(default=None, allow_inf_nan=False)
    max_reward: float | None = Field(default=None, allow_inf_nan=False)
    group: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    task: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    harness: str | None = Field(default=None, max_length=MAX_ID_CHARS, description="service.name")
    since: datetime | None = None
    until: datetime | None = None
    limit: int = Field(default=200, ge=1, le=5000)
    offset: int = Field(default=0, ge=0, le=10_000_000)


def rollouts_sql(f: RolloutFilter) -> str:
    """One page of the rollouts table, newest first; one row more than the page says there are more."""
    where = [
        f"{column} = {literal(value)}"
        for column, value in (
            ("split", f.split),
            ("status", f.status),
            ("group_id", f.group),
            ("task_id", f.task),
            ("service_name", f.harness),
        )
        if value
    ]
    if f.min_reward is not None:
        where.append(f"outcome_reward >= {f.min_reward!r}")
    if f.max_reward is not None:
        where.append(f"outcome_reward <= {f.max_reward!r}")
    if f.since is not None:
        where.append(f"started_at >= {literal(f.since.isoformat())}::TIMESTAMPTZ")
    if f.until is not None:
        where.append(f"started_at <= {literal(f.until.isoformat())}::TIMESTAMPTZ")
    condition = " AND ".join(where) or "true"
    return (
        f"SELECT {', '.join(ROLLOUT_COLUMNS)}, epoch_ms(started_at) AS started_ms"
        f" FROM rollouts WHERE {condition}"
        f" ORDER BY started_at DESC NULLS LAST, rollout_id LIMIT {f.limit + 1} OFFSET {f.offset}"
    )


def rollout_sql(rollout_id: str) -> str:
    return (
        f"SELECT *, epoch_ms(started_at) AS started_ms FROM rollouts WHERE rollout_id = {literal(rollout_id)}"
    )


def rollout_calls_sql(rollout_id: str) -> str:
    """The rollout's model calls in time order, messages and usage included."""
    return (
        f"SELECT {', '.join(CALL_COLUMNS)}, epoch_ms(started_at) AS started_ms,"
        " epoch_ms(ended_at) AS ended_ms"
        f" FROM llm_calls WHERE rollout_id = {literal(rollout_id)} ORDER BY start_time_unix_nano, span_id"
    )


def rollout_tools_sql(rollout_id: str) -> str:
    """The tool calls the rollout's model calls asked for, with the times of the tool spans that ran them."""
    return (
        "SELECT t.span_id, t.choice_index, t.tool_call_id, t.name, t.arguments, t.result, t.tool_span_id,"
        " (s.start_time_unix_nano // 1000000)::BIGINT AS started_ms,"
        " (s.end_time_unix_nano // 1000000)::BIGINT AS ended_ms"
        " FROM tool_calls t LEFT JOIN spans s ON s.trace_id = t.tool_trace_id AND s.span_id = t.tool_span_id"
        f" WHERE t.rollout_id = {literal(rollout_id)}"
    )


def rollout_steps_sql(rollout_id: str) -> str:
    return (
        "SELECT span_id, parent_span_id, kind, agent_name, name, epoch_ms(started_at) AS started_ms,"
        " epoch_ms(ended_at) AS ended_ms, duration_ms, is_error"
        f" FROM agent_steps WHERE rollout_id = {literal(rollout_id)} ORDER BY start_time_unix_nano"
    )


def rollout_rewards_sql(rollout_id: str) -> str:
    return (
        "SELECT level, name, value, label, explanation, source, span_id, epoch_ms(time) AS time_ms"
        f" FROM rewards WHERE rollout_id = {literal(rollout_id)} ORDER BY time"
    )


# The trainer's records and the gateway's reloads: from a sender the server vouches for (a rollout key's
# spans of the same scope and name are a harness's claims, never steps or reloads).
_VOUCHED = f"sender IN {sql_list(VOUCHED_SENDERS)}"
_TRAINER = f"scope_name = {literal(attr.TRAIN_SCOPE)} AND {_VOUCHED}"


def _train_spans(name: str, run_id: str | None) -> str:
    run = f"attributes ->> {literal(attr.TRAIN_RUN_ID)}"
    # the latest run when none is named: the one whose last record the server received last
    chosen = (
        literal(run_id)
        if run_id
        else f"(SELECT arg_max({run}, (commit_seq, start_time_unix_nano)) FROM spans WHERE {_TRAINER})"
    )
    return f"FROM spans WHERE {_TRAINER} AND name = {literal(name)} AND {run} = {chosen}"


def _figure(name: str, prefix: str = attr.TRAIN_PREFIX) -> str:
    return f"TRY_CAST(attributes ->> {literal(prefix + name)} AS DOUBLE) AS {name.replace('.', '_')}"


def training_runs_sql() -> str:
    run = f"attributes ->> {literal(attr.TRAIN_RUN_ID)}"
    return (
        f"SELECT {run} AS run_id,"
        f" count(*) FILTER (WHERE name = {literal(attr.TRAIN_STEP_SPAN_NAME)}) AS steps,"
        f" count(*) FILTER (WHERE name = {literal(attr.TRAIN_EVAL_SPAN_NAME)}) AS evals,"
        " (min(start_time_unix_nano) // 1000000)::BIGINT AS started_ms,"
        " (max(end_time_unix_nano) // 1000000)::BIGINT AS last_ms"
        f" FROM spans WHERE {_TRAINER} GROUP BY 1 ORDER BY last_ms DESC"
    )


def training_steps_sql(run_id: str | None) -> str:
    """One row per optimizer step of a run (the latest when `run_id` is None), in step order."""
    figures = [_figure(name) for name in STEP_FIGURES]
    figures += [
        f"TRY_CAST(attributes ->> {literal(attr.TRAIN_PREFIX + 'trainer.' + name)} AS DOUBLE) AS {name}"
        for name in TRAINER_FIGURES
    ]
    return (
        f"SELECT attributes ->> {literal(attr.TRAIN_RUN_ID)} AS run_id,"
        f" TRY_CAST(attributes ->> {literal(attr.TRAIN_PREFIX + 'step')} AS INTEGER) AS step,"
        f" TRY_CAST(attributes ->> {literal(attr.POLICY_VERSION)} AS INTEGER) AS policy_version,"
        f" {', '.join(figures)}, (end_time_unix_nano // 1000000)::BIGINT AS time_ms"
        f" {_train_spans(attr.TRAIN_STEP_SPAN_NAME, run_id)} ORDER BY step, start_time_unix_nano"
    )


def training_evals_sql(run_id: str | None) -> str:
    """One row per evaluation of a run (each eval harness at each policy version), in step order."""
    figures = ", ".join(_figure(name) for name in EVAL_FIGURES)
    return (
        f"SELECT attributes ->> {literal(attr.TRAIN_PREFIX + 'name')} AS eval,"
        f" TRY_CAST(attributes ->> {literal(attr.TRAIN_PREFIX + 'step')} AS INTEGER) AS step,"
        f" TRY_CAST(attributes ->> {literal(attr.POLICY_VERSION)} AS INTEGER) AS policy_version,"
        f" {figures}, (end_time_unix_nano // 1000000)::BIGINT AS time_ms"
        f" {_train_spans(attr.TRAIN_EVAL_SPAN_NAME, run_id)} ORDER BY step, eval"
    )


def reloads_sql(since_ms: int | None) -> str:
    """The gateway's weight reloads (each phase in ms), since a time (the training run's start) if given."""
    phases = ", ".join(
        f"TRY_CAST(attributes ->> {literal(f'otel_rl.reload.{phase}_ms')} AS DOUBLE) AS {phase}_ms"
        for phase in RELOAD_PHASES
    )
    since = "" if since_ms is None else f" AND start_time_unix_nano >= {int(since_ms) * 1_000_000}"
    return (
        f"SELECT TRY_CAST(attributes ->> {literal(attr.POLICY_VERSION)} AS INTEGER) AS policy_version,"
        f" {phases},"
        " status_code = 2 AS failed, (start_time_unix_nano // 1000000)::BIGINT AS time_ms"
        f" FROM spans WHERE name = {literal(attr.RELOAD_SPAN_NAME)} AND {_VOUCHED}{since}"
        " ORDER BY start_time_unix_nano"
    )


def staleness_sql(run_id: str | None) -> str:
    """Per step: how many policy versions behind the policy being trained its rollouts were sampled (the
    step's version - 1 - each rollout's oldest call version), at most and on average."""
    groups = literal(attr.TRAIN_PREFIX + "group_ids")
    return (
        "WITH step_groups AS ("
        f" SELECT TRY_CAST(attributes ->> {literal(attr.TRAIN_PREFIX + 'step')} AS INTEGER) AS step,"
        f" TRY_CAST(attributes ->> {literal(attr.POLICY_VERSION)} AS INTEGER) AS policy_version,"
        f" unnest(TRY_CAST(attributes -> {groups} AS VARCHAR[])) AS group_id"
        f" {_train_spans(attr.TRAIN_STEP_SPAN_NAME, run_id)})"
        " SELECT step, max(s.policy_version - 1 - r.policy_version_min) AS max_lag,"
        " avg(s.policy_version - 1 - r.policy_version_min) AS mean_lag, count(*) AS rollouts"
        " FROM step_groups s JOIN rollouts r USING (group_id) GROUP BY step ORDER BY step"
    )
