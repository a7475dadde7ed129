"""Hand-built rows of the `llm_calls`, `rollouts` and `rewards` views (their PLAN columns) for tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import polars as pl

LLM_CALLS_SCHEMA = pl.Schema(
    {
        "trace_id": pl.String,
        "span_id": pl.String,
        "parent_span_id": pl.String,
        "rollout_id": pl.String,
        "attempt_id": pl.String,
        "group_id": pl.String,
        "task_id": pl.String,
        "split": pl.String,
        "started_at": pl.Datetime("us", "UTC"),
        "ended_at": pl.Datetime("us", "UTC"),
        "start_time_unix_nano": pl.UInt64,
        "duration_ms": pl.Float64,
        "operation": pl.String,
        "provider": pl.String,
        "request_model": pl.String,
        "response_model": pl.String,
        "input_messages": pl.String,
        "output_messages": pl.String,
        "tool_definitions": pl.String,
        "n_choices": pl.Int32,
        "finish_reasons": pl.List(pl.String),
        "temperature": pl.Float64,
        "top_p": pl.Float64,
        "max_tokens": pl.Int32,
        "seed": pl.Int64,
        "input_tokens": pl.Int32,
        "output_tokens": pl.Int32,
        "streaming": pl.Boolean,
        "is_error": pl.Boolean,
        "error_type": pl.String,
        "dialect": pl.String,
        "prompt_token_ids": pl.List(pl.Int32),
        "completion_token_ids": pl.List(pl.List(pl.Int32)),
        "completion_logprobs": pl.List(pl.List(pl.Float32)),
        "logprobs_source": pl.String,
        "decoding_constrained": pl.Boolean,
        "policy_version": pl.Int32,
        "sampling_params": pl.String,
        "server_url": pl.String,
        "service_name": pl.String,
        "scope_name": pl.String,
    }
)
ROLLOUTS_SCHEMA = pl.Schema(
    {
        "rollout_id": pl.String,
        "attempt_id": pl.String,
        "group_id": pl.String,
        "task_id": pl.String,
        "split": pl.String,
        "status": pl.String,
        "exit_code": pl.Int32,
        "started_at": pl.Datetime("us", "UTC"),
        "ended_at": pl.Datetime("us", "UTC"),
        "duration_ms": pl.Float64,
        "n_calls": pl.Int64,
        "n_error_calls": pl.Int64,
        "outcome_reward": pl.Float64,
        "service_name": pl.String,
        "trace_ids": pl.List(pl.String),
        "policy_version_min": pl.Int32,
        "policy_version_max": pl.Int32,
    }
)
REWARDS_SCHEMA = pl.Schema(
    {
        "rollout_id": pl.String,
        "trace_id": pl.String,
        "span_id": pl.String,
        "level": pl.String,
        "name": pl.String,
        "value": pl.Float64,
        "label": pl.String,
        "explanation": pl.String,
        "source": pl.String,
        "origin": pl.String,
        "time": pl.Datetime("us", "UTC"),
        "received_at": pl.Datetime("us", "UTC"),
        "seq": pl.UInt64,
    }
)


def call(
    rollout_id: str,
    span_id: str,
    prompt: list[int] | None,
    completions: list[list[int]] | None,
    logprobs: list[list[float]] | None = None,
    *,
    t: int,
    finish: list[str] | None = None,
    is_error: bool = False,
    version: int | None = 0,
    messages: list[dict[str, Any]] | None = None,
    outputs: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
    logprobs_source: str = "sampling",
) -> dict[str, Any]:
    """One `llm_calls` row; `t` orders calls in time."""
    n = len(completions) if completions is not None else len(outputs or [])
    return {
        "trace_id": f"trace-{rollout_id}",
        "span_id": span_id,
        "rollout_id": rollout_id,
        "start_time_unix_nano": 1_000_000_000 * t,
        "started_at": datetime.fromtimestamp(t, UTC),
        "operation": "chat",
        "n_choices": n,
        "finish_reasons": finish if finish is not None else ["stop"] * n,
        "is_error": is_error,
        "dialect": "gateway",
        "prompt_token_ids": prompt,
        "completion_token_ids": completions,
        "completion_logprobs": logprobs,
        "logprobs_source": logprobs_source if logprobs is not None else None,
        "decoding_constrained": logprobs_source != "sampling",
        "policy_version": version,
        "input_messages": json.dumps(messages) if messages is not None else None,
        "output_messages": json.dumps(outputs) if outputs is not None else None,
        "tool_definitions": json.dumps(tools) if tools is not None else None,
    }


def calls_frame(*rows: dict[str, Any]) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema=LLM_CALLS_SCHEMA).sort("rollout_id", "start_time_unix_nano")


def rollouts_frame(*rows: tuple[str, str | None, str]) -> pl.DataFrame:
    """Rows of (rollout_id, group_id, status)."""
    return pl.DataFrame(
        [
            {"rollout_id": r, "attempt_id": f"{r}-a0", "group_id": g, "task_id": "task", "status": s}
            for r, g, s in rows
        ],
        schema=ROLLOUTS_SCHEMA,
    )


def rewards_frame(*rows: tuple[str, float], source: str = "grader", name: str = "outcome") -> pl.DataFrame:
    """Outcome rewards: rows of (rollout_id, value), in time order (as received, logs numbered in order)."""
    return pl.DataFrame(
        [
            {
                "rollout_id": r,
                "level": "outcome",
                "name": name,
                "value": v,
                "source": source,
                "origin": "log",
                "time": datetime.fromtimestamp(1000 + i, UTC),
                "received_at": datetime.fromtimestamp(1000 + i, UTC),
                "seq": i,
            }
            for i, (r, v) in enumerate(rows)
        ],
        schema=REWARDS_SCHEMA,
    )
