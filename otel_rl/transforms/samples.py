"""The samples pipeline: rollouts, their calls and rewards -> token-aligned training samples + a report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from otel_rl.store import reads
from otel_rl.store.reads import MESSAGE_COLUMNS, ROLLOUT_COLUMNS, Params
from otel_rl.transforms.advantages import Estimator, loss_weights, rollout_advantages
from otel_rl.transforms.limits import Limits, apply_limits
from otel_rl.transforms.merge import Break, merge_segments
from otel_rl.transforms.rewards import (
    INFRA_FAILURE_STATUSES,
    TRUNCATED_STATUS,
    RewardSpec,
    attach_turn_rewards,
    outcome_rewards,
    outcome_sources,
    trust_flag,
    turn_rewards,
    untrusted_hint,
)
from otel_rl.transforms.screening import screen, with_flags
from otel_rl.transforms.staleness import fresh
from otel_rl.transforms.tokens import Drift, call_tokens, measure_drift

# The sample schema (docs/samples.md), in column order.
SAMPLE_COLUMNS = (
    "segment_id",
    "rollout_id",
    "attempt_id",
    "group_id",
    "task_id",
    "prompt_ids",
    "response_ids",
    "response_mask",
    "rollout_logprobs",
    "has_logprobs",
    "reward",
    "advantage",
    "loss_weight",
    "turn_rewards",
    "policy_version_min",
    "policy_version_max",
    "token_source",
    "n_calls",
    "truncated",
    "span_ids",
    "choice_indices",
    "constrained_calls",
)
SHOWN_GROUPS = 20


@dataclass(frozen=True)
class SampleOptions:
    """Everything that decides which samples come out (every default is documented in docs/samples.md)."""

    reward: RewardSpec = RewardSpec()
    limits: Limits = Limits()
    estimator: Estimator = "grpo"
    current_policy_version: int | None = None
    max_staleness: int | None = None
    # By default a rollout with a failed model call is an infrastructure failure and is excluded; with
    # skip_error_calls the rollout is kept and only the failed calls are left out.
    skip_error_calls: bool = False
    drift_sample: int = 64  # exact calls retokenized to measure drift (when a tokenizer is given)


@dataclass
class Report:
    """What an export read, kept, dropped and cut, and why."""

    rollouts: int = 0
    rollouts_used: int = 0
    calls: int = 0
    calls_used: int = 0
    segments: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    sampled_tokens: int = 0
    dropped_rollouts: dict[str, int] = field(default_factory=dict)
    dropped_calls: dict[str, int] = field(default_factory=dict)
    dropped_segments: dict[str, int] = field(default_factory=dict)
    # Calls that started a segment of their own although their rollout had one open: their prompt is not their
    # predecessor's prompt + answer (a chat template re-rendering an answer, a harness editing its history).
    # first_break: the first such call, where its prompt differs (span_id, position, expected, found ids).
    unmerged_calls: int = 0
    first_break: dict[str, Any] | None = None
    # Rollouts whose outcome rewards all came from untrusted sources (dropped as `untrusted_reward`, or
    # given the fill value), by source (NO_SOURCE: sent without one)
    untrusted_rewards: dict[str, int] = field(default_factory=dict)
    cut: dict[str, int] = field(default_factory=dict)
    token_sources: dict[str, int] = field(default_factory=dict)  # calls by source
    logprobs_sources: dict[str, int] = field(default_factory=dict)  # calls with logprobs, by their source
    drift: Drift | None = None
    # Rollouts a hack detector flagged (the hack_flags view), left out before anything else, and by detector
    screened: int = 0
    screened_by_detector: dict[str, int] = field(default_factory=dict)
    reward_by_group: dict[str, dict[str, float]] = field(default_factory=dict)  # group -> rollouts, mean

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.drift is not None:
            out["drift"]["share"] = self.drift.share
        return out

    def why_dropped(self, trust: Callable[[str], str] = trust_flag) -> str:
        """The dropped rollouts by reason, with the untrusted rewards' sources and the option that trusts
        them (`trust`: see rewards.untrusted_hint)."""
        reasons = ", ".join(f"{reason}: {n}" for reason, n in self.dropped_rollouts.items()) or "none dropped"
        if self.screened:
            reasons += f"; screened by hack_flags: {self.screened}"
        if not self.untrusted_rewards:
            return reasons
        return f"{reasons} (untrusted rewards: {untrusted_hint(self.untrusted_rewards, trust)})"


def _count(frame: pl.DataFrame, column: str) -> dict[str, int]:
    return dict(frame.group_by(column).len().sort(column).iter_rows())


def exclude_rollouts(
    rollouts: pl.DataFrame, calls: pl.DataFrame, rewards: pl.DataFrame, options: SampleOptions
) -> tuple[pl.DataFrame, dict[str, int], dict[str, int]]:
    """Rollouts that can be scored, with their `reward`; the others counted by reason; and the rollouts left
    with untrusted rewards only, counted by source.

    Infrastructure failures (status timeout / crashed / infra_error, or a failed model call unless
    `skip_error_calls`), episodes cut by a turn or context limit (status truncated) and unfinished rollouts
    are excluded, never scored 0. Then a rollout needs a trusted
    reward, unless `reward.missing` gives a fill value: without one it is dropped as `untrusted_reward` when
    rewards of the name came from other sources only, else as `missing_reward`.
    """
    failed_calls = calls.filter(pl.col("is_error").fill_null(False)).select("rollout_id").unique()
    reason = (
        pl.when(pl.col("status").is_in(INFRA_FAILURE_STATUSES))
        .then(pl.format("status_{}", "status"))
        .when(pl.col("status") == TRUNCATED_STATUS)
        .then(pl.lit("truncated"))
        .when(pl.col("status") == "running")
        .then(pl.lit("still_running"))
    )
    if not options.skip_error_calls:
        reason = reason.when(pl.col("rollout_id").is_in(failed_calls["rollout_id"].implode())).then(
            pl.lit("model_call_failed")
        )
    scored = (
        rollouts.join(outcome_rewards(rewards, options.reward), on="rollout_id", how="left")
        .join(outcome_sources(rewards, options.reward), on="rollout_id", how="left")
        .with_columns(_untrusted=pl.col("reward").is_null() & pl.col("reward_sources").is_not_null())
    )
    if options.reward.missing is None:
        reason = (
            reason.when(pl.col("_untrusted"))
            .then(pl.lit("untrusted_reward"))
            .when(pl.col("reward").is_null())
            .then(pl.lit("missing_reward"))
        )
    else:
        # filled in but still counted below: a fill value must not hide every reward the harness sent
        scored = scored.with_columns(pl.col("reward").fill_null(options.reward.missing))
    scored = scored.with_columns(_drop=reason)
    # among the rollouts their reward decides for: an infrastructure failure is out whatever its rewards
    decided_by_reward = pl.col("_drop").is_null() | (pl.col("_drop") == "untrusted_reward")
    by_source = _count(
        scored.filter(pl.col("_untrusted") & decided_by_reward).select(pl.col("reward_sources").explode()),
        "reward_sources",
    )
    kept = scored.filter(pl.col("_drop").is_null()).drop("_drop", "_untrusted", "reward_sources")
    return kept, _count(scored.drop_nulls("_drop"), "_drop"), by_source


def build_samples(
    calls: pl.DataFrame,
    rollouts: pl.DataFrame,
    rewards: pl.DataFrame,
    *,
    tokenizer: Any | None = None,
    options: SampleOptions = SampleOptions(),
) -> tuple[pl.DataFrame, Report]:
    """Selected rollouts (rows of the `rollouts` view), their `llm_calls` rows and `rewards` rows -> samples.

    `calls` must be grouped by rollout, in time order within one (ORDER BY rollout_id, start_time_unix_nano).
    The tokenizer (a transformers tokenizer with a chat template) is needed only for calls without exact ids.
    """
    if tokenizer is not None and not set(MESSAGE_COLUMNS) <= set(calls.columns):
        raise ValueError(
            "retokenizing needs the calls' messages: load them with load_inputs(..., messages=True)"
        )
    report = Report(rollouts=rollouts.height)
    rollouts, report.screened, report.screened_by_detector = screen(rollouts)
    calls = calls.filter(pl.col("rollout_id").is_in(rollouts["rollout_id"].implode()))
    report.calls = calls.height
    scored, report.dropped_rollouts, report.untrusted_rewards = exclude_rollouts(
        rollouts, calls, rewards, options
    )
    calls = calls.filter(pl.col("rollout_id").is_in(scored["rollout_id"].implode()))
    failed = pl.col("is_error").fill_null(False)
    dropped_calls = {"model_call_failed": calls.filter(failed).height}
    calls = call_tokens(calls.filter(~failed), tokenizer)
    sources = calls["token_source"].fill_null("none")
    report.token_sources = dict(sources.value_counts().sort("token_source").iter_rows())
    dropped_calls["no_token_ids"] = report.token_sources.get("none", 0)
    report.logprobs_sources = _count(calls.drop_nulls("logprobs_source"), "logprobs_source")
    if tokenizer is not None and options.drift_sample > 0:
        report.drift = measure_drift(calls, tokenizer, options.drift_sample)

    mergeable = calls.filter(pl.col("token_source").is_not_null())
    segments, merge_counts = merge_segments(mergeable)
    report.unmerged_calls = merge_counts.unmerged_calls
    if merge_counts.first_break is not None:
        report.first_break = break_record(merge_counts.first_break, mergeable, tokenizer)
    dropped_calls["duplicate_call"] = merge_counts.duplicate_calls
    dropped_calls["aborted_choice"] = merge_counts.aborted_choices
    report.dropped_calls = {k: v for k, v in dropped_calls.items() if v}

    # Stale segments go before advantages: a rollout left with none never shapes its group's baseline.
    kept = _fresh_segments(segments, options)
    stale = segments.filter(~pl.col("rollout_id").is_in(kept["rollout_id"].implode()))["rollout_id"].unique()
    dropped_segments = {"stale": segments.height - kept.height}
    segments = kept
    scored = scored.filter(~pl.col("rollout_id").is_in(stale.implode()))
    report.dropped_rollouts["stale"] = stale.len()
    scored = rollout_advantages(scored, options.estimator)
    report.reward_by_group = {
        group: {"rollouts": n, "mean_reward": mean}
        for group, n, mean in scored.group_by(pl.col("group_id").fill_null("(none)"))
        .agg(pl.len(), pl.col("reward").mean())
        .sort("group_id")
        .iter_rows()
    }
    segments = attach_turn_rewards(
        segments.join(scored.select(ROLLOUT_COLUMNS[:4] + ("reward", "advantage")), on="rollout_id"),
        turn_rewards(rewards, options.reward),
    )
    segments, limit_counts = apply_limits(segments, options.limits)
    dropped_segments |= {
        k: v for k, v in limit_counts.items() if k in ("prompt_too_long", "no_sampled_tokens")
    }
    report.dropped_segments = {k: v for k, v in dropped_segments.items() if v}
    report.cut = {k: v for k, v in limit_counts.items() if k.startswith("response_")}
    samples = loss_weights(segments).select(SAMPLE_COLUMNS)

    used_rollouts = samples["rollout_id"].unique()
    report.dropped_rollouts["no_samples"] = scored.height - used_rollouts.len()
    report.dropped_rollouts = {k: v for k, v in report.dropped_rollouts.items() if v}
    report.rollouts_used = used_rollouts.len()
    report.calls_used = samples["span_ids"].explode().drop_nulls().n_unique()
    report.segments = samples.height
    tokens = samples.select(
        pl.col("prompt_ids").list.len().sum(),
        pl.col("response_ids").list.len().sum(),
        pl.col("response_mask").list.sum().sum(),
    ).row(0)
    report.prompt_tokens, report.response_tokens, report.sampled_tokens = (int(t or 0) for t in tokens)
    return samples, report


def _fresh_segments(segments: pl.DataFrame, options: SampleOptions) -> pl.DataFrame:
    """The segments fresh enough to train `options.current_policy_version` (transforms/staleness.py); all of
    them when no version or bound is given."""
    if options.current_policy_version is None or options.max_staleness is None:
        return segments
    version, bound = options.current_policy_version, options.max_staleness
    return segments.filter(fresh(pl.col("policy_version_min"), version, bound))


def load_inputs(
    where: str, run: reads.Run, *, params: Params | None = None, messages: bool = False
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The rollouts matching `where` (a SQL predicate over the `rollouts` view, its parameters in `params`),
    their calls and rewards.

    `run(sql, params)` runs one read-only SQL statement (`otel_rl.query`, the server's /v1/query, a store).
    Only the columns the pipeline reads are selected, token lists arriving as Arrow lists; the calls' messages
    only with `messages` (needed to retokenize, to measure drift, and for SFT).
    """
    rollouts = reads.selected_rollouts(run, where, params)
    ids = rollouts["rollout_id"].to_list()
    calls = reads.rollout_calls(run, ids, messages=messages)
    rewards = reads.rollout_rewards(run, ids)
    return calls, with_flags(rollouts.drop("n_calls"), run), rewards


def break_record(where: Break, calls: pl.DataFrame, tokenizer: Any | None) -> dict[str, Any]:
    """The first call that did not merge, for the report: its span, the position and the two token ids, and
    their text when a tokenizer is at hand."""
    record: dict[str, Any] = {
        "span_id": calls["span_id"][where.call],
        "position": where.position,
        "expected": where.expected,
        "found": where.found,
    }
    if tokenizer is not None:
        for key in ("expected", "found"):
            if record[key] is not None:
                record[f"{key}_text"] = tokenizer.decode([record[key]])
    return record


def break_line(report: Report) -> str:
    """The report's line on calls that did not merge into their predecessor."""
    line = (
        f"{report.unmerged_calls} started a segment of their own: their prompt does not continue the previous"
        " call's prompt + answer"
    )
    if report.first_break is None:
        return line
    found = report.first_break

    def token(key: str) -> str:
        if found[key] is None:
            return "its end"
        text = found.get(f"{key}_text")
        return f"token {found[key]}" + (f" {text!r}" if text is not None else "")

    return (
        f"{line}; first: call {found['span_id']} at prompt token {found['position']}, "
        f"{token('found')} where the previous call's prompt + answer has {token('expected')}"
    )


def report_table(report: Report) -> Any:
    """The report as a rich renderable, for `otel-rl export`."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="samples", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("rollouts", f"{report.rollouts_used} used of {report.rollouts}")
    table.add_row("calls", f"{report.calls_used} used of {report.calls}")
    table.add_row("segments", str(report.segments))
    if report.screened:
        detectors = ", ".join(f"{name}: {n}" for name, n in report.screened_by_detector.items())
        table.add_row("screened", f"{report.screened} rollouts flagged by hack_flags ({escape(detectors)})")
    table.add_row(
        "tokens",
        f"{report.prompt_tokens} prompt, {report.response_tokens} response ({report.sampled_tokens} sampled)",
    )
    for unit, counts in (
        ("rollouts", report.dropped_rollouts),
        ("calls", report.dropped_calls),
        ("segments", report.dropped_segments),
    ):
        if counts:
            table.add_row(f"dropped {unit}", ", ".join(f"{reason}: {n}" for reason, n in counts.items()))
    if report.unmerged_calls:
        table.add_row("unmerged calls", escape(break_line(report)))
    if report.untrusted_rewards:
        # the sources are the senders' text: shown as it is, not read as rich markup
        table.add_row("untrusted rewards", escape(untrusted_hint(report.untrusted_rewards)))
    if report.cut:
        table.add_row("cut", ", ".join(f"{reason}: {n}" for reason, n in report.cut.items()))
    table.add_row("token sources", ", ".join(f"{s}: {n}" for s, n in report.token_sources.items()) or "-")
    if report.logprobs_sources:
        table.add_row("logprobs", ", ".join(f"{s}: {n}" for s, n in report.logprobs_sources.items()))
    if report.drift is not None:
        drift = report.drift
        where = f", first difference at {sorted(drift.first_diff_positions)[:5]}" if drift.differing else ""
        table.add_row(
            "drift", f"{drift.differing} of {drift.compared} calls differ ({drift.share:.0%}){where}"
        )
    groups = list(report.reward_by_group.items())
    for group, stats in groups[:SHOWN_GROUPS]:
        table.add_row(
            f"group {group}", f"{stats['rollouts']} rollouts, mean reward {stats['mean_reward']:.3f}"
        )
    if len(groups) > SHOWN_GROUPS:
        table.add_row("", f"... {len(groups) - SHOWN_GROUPS} more groups (Report.reward_by_group)")
    return table
