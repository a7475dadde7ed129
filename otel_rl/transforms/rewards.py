"""Outcome rewards per rollout and turn rewards per call from `gen_ai.evaluation.result`, trusted only."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from typing import Literal

import polars as pl
from pydantic.dataclasses import dataclass

from otel_rl.attributes import REWARD_SOURCE_GRADER

AggregationRule = Literal["last", "mean", "max", "sum"]

# Only graders are trusted by default: rewards posted to the server's /v1/rewards endpoint (source "grader"
# unless the poster says otherwise) or emitted with that source with the admin token. A reward emitted from
# inside the agent's own process is not trusted unless configured: the policy can steer that process. Sent
# with a rollout key, its source is "harness" whatever it says (the collector rewrites it).
DEFAULT_TRUSTED_SOURCES = (REWARD_SOURCE_GRADER,)
# Trusts every source, a reward sent without one too (`--trusted-source any`, `trusted_sources: [any]`).
ANY_SOURCE = "any"
NO_SOURCE = "(none)"  # how reports count the rewards sent without otel_rl.reward.source
SHOWN_SOURCES = 5  # a report names this many untrusted sources, then counts the rest
SHOWN_SOURCE_CHARS = 64  # a source is the sender's text: reports cut it

# Statuses that say the infrastructure failed, not the policy: such rollouts are excluded, never scored 0.
INFRA_FAILURE_STATUSES = ("timeout", "crashed", "infra_error")
# An episode cut by its harness's turn or context limit: excluded (masked from the loss), never scored 0.
TRUNCATED_STATUS = "truncated"


@dataclass(frozen=True)
class RewardSpec:
    """Which evaluation events count as the reward, and how several of them combine."""

    name: str = "outcome"
    rule: AggregationRule = "last"
    trusted_sources: tuple[str, ...] = DEFAULT_TRUSTED_SOURCES
    missing: float | None = None  # the reward of a rollout that has none; None drops the rollout


def _aggregate(rule: AggregationRule) -> pl.Expr:
    value = pl.col("value")
    return {
        # by the server's receive order: a sender's clock (a record timed in the future) cannot make it last
        "last": value.sort_by("received_at", "seq", nulls_last=False).last(),
        "mean": value.mean(),
        "max": value.max(),
        "sum": value.sum(),
    }[rule]


def named(rewards: pl.DataFrame, spec: RewardSpec) -> pl.DataFrame:
    """The evaluation events named `spec.name` with a numeric value, from any source."""
    return rewards.filter(
        (pl.col("name") == spec.name) & pl.col("value").is_not_null() & pl.col("value").is_not_nan()
    )


def trusted(rewards: pl.DataFrame, spec: RewardSpec) -> pl.DataFrame:
    """The evaluation events named `spec.name` from trusted sources, with a numeric value."""
    if ANY_SOURCE in spec.trusted_sources:
        return named(rewards, spec)
    return named(rewards, spec).filter(pl.col("source").is_in(spec.trusted_sources))


def outcome_sources(rewards: pl.DataFrame, spec: RewardSpec) -> pl.DataFrame:
    """One row per rollout with outcome rewards named `spec.name`: `rollout_id`, `reward_sources` (every
    source they came from, NO_SOURCE for those sent without one): what a rollout without a trusted reward
    had instead."""
    return (
        named(rewards, spec)
        .filter(pl.col("level") == "outcome")
        .group_by("rollout_id")
        .agg(pl.col("source").fill_null(NO_SOURCE).unique().sort().alias("reward_sources"))
    )


def trust_flag(source: str) -> str:
    """How `otel-rl export` trusts a source."""
    return f"--trusted-source {shlex.quote(source)}"


def trust_setting(source: str) -> str:
    """How a training config trusts a source. JSON strings: valid YAML, and never read as rich markup."""
    return f"reward.trusted_sources: [{json.dumps(source)}]"


def untrusted_hint(by_source: Mapping[str, int], trust: Callable[[str], str] = trust_flag) -> str:
    """The untrusted sources of dropped rewards with their rollout counts, and the option that trusts them
    (`trust` writes it for one source: trust_flag, trust_setting). Only `any` trusts a reward without one."""
    counts = sorted(by_source.items(), key=lambda item: -item[1])
    shown = [
        f"no source ({n})" if source == NO_SOURCE else f"source {_cut(source)!r} ({n})"
        for source, n in counts[:SHOWN_SOURCES]
    ]
    if len(counts) > SHOWN_SOURCES:
        shown.append(f"{len(counts) - SHOWN_SOURCES} more sources")
    named_sources = [source for source, _ in counts[:SHOWN_SOURCES] if source != NO_SOURCE]
    options = [trust(_cut(source)) for source in named_sources]
    return f"{', '.join(shown)}; trust them with {' or '.join([*options, trust(ANY_SOURCE)])}"


def _cut(source: str) -> str:
    return source if len(source) <= SHOWN_SOURCE_CHARS else source[:SHOWN_SOURCE_CHARS] + "…"


def outcome_rewards(rewards: pl.DataFrame, spec: RewardSpec) -> pl.DataFrame:
    """One row per rollout with trusted outcome rewards: `rollout_id`, `reward` (aggregated by the rule)."""
    return (
        trusted(rewards, spec)
        .filter(pl.col("level") == "outcome")
        .group_by("rollout_id")
        .agg(_aggregate(spec.rule).cast(pl.Float64).alias("reward"))
    )


def turn_rewards(rewards: pl.DataFrame, spec: RewardSpec) -> pl.DataFrame:
    """One row per rewarded call: `span_id` (the LLM call span), `turn_reward` (aggregated by the rule)."""
    return (
        trusted(rewards, spec)
        .filter(pl.col("level") == "turn")
        .group_by("span_id")
        .agg(_aggregate(spec.rule).cast(pl.Float64).alias("turn_reward"))
    )


def attach_turn_rewards(segments: pl.DataFrame, turns: pl.DataFrame) -> pl.DataFrame:
    """Add `turn_rewards`: a list of {position, value}, position being the index in `response_ids` of the
    rewarded call's last sampled token. Empty when the segment has none."""
    per_call = (
        segments.select("segment_id", "span_ids", "turn_ends")
        .explode("span_ids", "turn_ends")
        .join(turns, left_on="span_ids", right_on="span_id", how="inner")
        .group_by("segment_id")
        .agg(
            pl.struct(position=(pl.col("turn_ends") - 1).cast(pl.Int32), value=pl.col("turn_reward")).alias(
                "turn_rewards"
            )
        )
    )
    empty = pl.lit([], dtype=pl.List(pl.Struct({"position": pl.Int32, "value": pl.Float64})))
    return segments.join(per_call, on="segment_id", how="left").with_columns(
        pl.col("turn_rewards").fill_null(empty)
    )
