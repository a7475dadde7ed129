"""The web view's reads of the store (ui/routes.py, ui/inspector.py), as named functions returning polars
frames: the rollouts table, a rollout's timeline, the training page. Bound as store/reads.py's are."""

from __future__ import annotations

import re
from datetime import datetime

import polars as pl

from otel_rl import attributes as attr
from otel_rl.store.reads import FLAGS_COLUMN, RECEIVED, VOUCHED, Run, hack_flags, vouched

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
FLAGGED_BY = "SELECT rollout_id FROM hack_flags WHERE list_contains(detectors,"
EVIDENCE_ARGUMENT_CHARS = 400  # of a flagged tool call's arguments on the rollout page
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
    "batch_wait_s",
    "transform_waited_s",
)
TRAINER_FIGURES = ("loss", "mismatch", "is_weight_mean", "grad_norm")
EVAL_FIGURES = ("reward_mean", "success_rate", "rollouts", "wall_s")
RELOAD_PHASES = ("drain", "pause", "reload", "verify", "resume", "total")


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
    flagged: bool | None = None,
    detector: str | None = None,
    limit: int = 200,
    offset: int = 0,
) -> pl.DataFrame:
    """One page of the rollouts table, newest first; one row more than `limit` says there are more. Each
    filter given narrows it (`harness`: the service name; `flagged`: flagged by a hack detector or not;
    `detector`: flagged by that one). Each row names the detectors that flagged it (FLAGS_COLUMN)."""
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
        f"rollout_id IN ({FLAGGED_BY} $detector))": detector,
    }
    if flagged is not None:  # no value to bind: the condition alone
        conditions[f"rollout_id {'' if flagged else 'NOT '}IN (SELECT rollout_id FROM hack_flags)"] = True
    used = {condition: value for condition, value in conditions.items() if value not in (None, "")}
    named = {
        re.search(r"\$(\w+)", condition)[1]: value for condition, value in used.items() if "$" in condition
    }
    sql = (
        f"SELECT {', '.join(PAGE_ROLLOUT_COLUMNS)}, epoch_ms(started_at) AS started_ms FROM rollouts"
        f" WHERE {' AND '.join(used) or 'true'}"
        " ORDER BY started_at DESC NULLS LAST, rollout_id LIMIT $limit OFFSET $offset"
    )
    page = run(sql, {**named, "limit": limit + 1, "offset": offset})
    # the page's flags only: the detectors run over these rollouts' tool calls, not the whole store's
    flags = hack_flags(run, page["rollout_id"].to_list()) if page.height else None
    if flags is None or flags.height == 0:
        return page.with_columns(pl.lit(None, pl.List(pl.String)).alias(FLAGS_COLUMN))
    return page.join(flags, on="rollout_id", how="left", maintain_order="left")


def rollout(run: Run, rollout_id: str) -> pl.DataFrame:
    """The rollout's row of the `rollouts` view (none: no such rollout)."""
    return run(
        "SELECT *, epoch_ms(started_at) AS started_ms FROM rollouts WHERE rollout_id = $1", [rollout_id]
    )


def rollout_detections(run: Run, rollout_id: str) -> pl.DataFrame:
    """Every piece of hack evidence of the rollout (the `detections` view): the detector, the matched text,
    the span that holds it and, when a tool call shows it, its tool name and arguments (an excerpt)."""
    sql = (
        "SELECT d.detector, d.evidence, d.evidence_id, d.trace_id, d.span_id, t.name AS tool_name,"
        f" left(t.arguments, {EVIDENCE_ARGUMENT_CHARS}) AS arguments"
        " FROM detections d LEFT JOIN (SELECT DISTINCT rollout_id, evidence_id, span_id, name, arguments"
        " FROM tool_call_texts WHERE rollout_id = $1) t"
        " ON t.evidence_id = d.evidence_id AND t.span_id = d.span_id"
        " WHERE d.rollout_id = $1 ORDER BY d.detector, d.evidence_id, d.evidence"
    )
    return run(sql, [rollout_id])


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
_TRAINER = f"scope_name = '{attr.TRAIN_SCOPE}' AND {VOUCHED}"
_RUN = f"attributes ->> '{attr.TRAIN_RUN_ID}'"


def _chosen_run(run_id: str | None) -> str:
    """The statement's run: `$run`, else the latest (whose last record the server received last)."""
    latest = f"(SELECT arg_max({_RUN}, {RECEIVED}) FROM spans WHERE {_TRAINER})"
    return f"{_RUN} = {'$run' if run_id else latest}"


def _run_named(run_id: str | None, span: str) -> dict[str, object]:
    """The parameters of a statement over one kind of trainer span (`$span`) of the chosen run."""
    return vouched(span=span, run=run_id) if run_id else vouched(span=span)


def _figure(key: str, name: str, kind: str = "DOUBLE") -> str:
    return f"TRY_CAST(attributes ->> '{key}' AS {kind}) AS {name}"


def training_runs(run: Run) -> pl.DataFrame:
    """The training runs the store recorded, the latest first."""
    sql = (
        f"SELECT {_RUN} AS run_id,"
        " count(*) FILTER (WHERE name = $step_span) AS steps,"
        " count(*) FILTER (WHERE name = $eval_span) AS evals,"
        " (min(start_time_unix_nano) // 1000000)::BIGINT AS started_ms,"
        " (max(end_time_unix_nano) // 1000000)::BIGINT AS last_ms"
        f" FROM spans WHERE {_TRAINER} GROUP BY 1 ORDER BY last_ms DESC"
    )
    return run(sql, vouched(step_span=attr.TRAIN_STEP_SPAN_NAME, eval_span=attr.TRAIN_EVAL_SPAN_NAME))


def training_steps(run: Run, run_id: str | None) -> pl.DataFrame:
    """One row per optimizer step of a run (the latest when `run_id` is None), in step order."""
    figures = [_figure(attr.TRAIN_PREFIX + name, name) for name in STEP_FIGURES]
    figures += [_figure(f"{attr.TRAIN_PREFIX}trainer.{name}", name) for name in TRAINER_FIGURES]
    sql = (
        f"SELECT {_RUN} AS run_id, {_figure(attr.TRAIN_PREFIX + 'step', 'step', 'INTEGER')},"
        f" {_figure(attr.POLICY_VERSION, 'policy_version', 'INTEGER')},"
        f" {', '.join(figures)}, (end_time_unix_nano // 1000000)::BIGINT AS time_ms"
        f" FROM spans WHERE {_TRAINER} AND name = $span AND {_chosen_run(run_id)}"
        " ORDER BY step, start_time_unix_nano"
    )
    return run(sql, _run_named(run_id, attr.TRAIN_STEP_SPAN_NAME))


def training_evals(run: Run, run_id: str | None) -> pl.DataFrame:
    """One row per evaluation of a run (each eval harness at each policy version), in step order."""
    figures = ", ".join(_figure(attr.TRAIN_PREFIX + name, name) for name in EVAL_FIGURES)
    sql = (
        "SELECT attributes ->> $name_key AS eval,"
        f" {_figure(attr.TRAIN_PREFIX + 'step', 'step', 'INTEGER')},"
        f" {_figure(attr.POLICY_VERSION, 'policy_version', 'INTEGER')},"
        f" {figures}, (end_time_unix_nano // 1000000)::BIGINT AS time_ms"
        f" FROM spans WHERE {_TRAINER} AND name = $span AND {_chosen_run(run_id)}"
        " ORDER BY step, eval"
    )
    return run(sql, _run_named(run_id, attr.TRAIN_EVAL_SPAN_NAME) | {"name_key": f"{attr.TRAIN_PREFIX}name"})


def reloads(run: Run, since_ms: int | None) -> pl.DataFrame:
    """The gateway's weight reloads (each phase in ms), since a time (a training run's start) if given."""
    phases = ", ".join(_figure(f"otel_rl.reload.{phase}_ms", f"{phase}_ms") for phase in RELOAD_PHASES)
    sql = (
        f"SELECT {_figure(attr.POLICY_VERSION, 'policy_version', 'INTEGER')}, {phases},"
        " status_code = 2 AS failed, (start_time_unix_nano // 1000000)::BIGINT AS time_ms"
        f" FROM spans WHERE name = $span AND {VOUCHED}"
        f"{'' if since_ms is None else ' AND start_time_unix_nano >= $since_ns'}"
        " ORDER BY start_time_unix_nano"
    )
    since = {} if since_ms is None else {"since_ns": int(since_ms) * 1_000_000}
    return run(sql, vouched(span=attr.RELOAD_SPAN_NAME, **since))


def step_rollout_versions(run: Run, run_id: str | None) -> pl.DataFrame:
    """Per step of a run and rollout of its groups: the `policy_version` the step span records (the version
    the step produced) and the rollout's oldest call's version (`policy_version_min`)."""
    sql = (
        "WITH step_groups AS ("
        f" SELECT {_figure(attr.TRAIN_PREFIX + 'step', 'step', 'INTEGER')},"
        f" {_figure(attr.POLICY_VERSION, 'policy_version', 'INTEGER')},"
        f" unnest(TRY_CAST(attributes -> '{attr.TRAIN_PREFIX}group_ids' AS VARCHAR[])) AS group_id"
        f" FROM spans WHERE {_TRAINER} AND name = $span AND {_chosen_run(run_id)})"
        " SELECT s.step, s.policy_version, r.policy_version_min"
        " FROM step_groups s JOIN rollouts r USING (group_id) ORDER BY s.step"
    )
    return run(sql, _run_named(run_id, attr.TRAIN_STEP_SPAN_NAME))
