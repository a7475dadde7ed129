"""Length limits on segments: drop over-long prompts, truncate over-long responses."""

from __future__ import annotations

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

RESPONSE_COLUMNS = ("response_ids", "response_mask", "rollout_logprobs")


class Limits(BaseModel):
    """Maximum prompt and response lengths in tokens (None: no limit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_prompt_length: int | None = Field(None, ge=1)
    max_response_length: int | None = Field(None, ge=1)


def apply_limits(segments: pl.DataFrame, limits: Limits) -> tuple[pl.DataFrame, dict[str, int]]:
    """Apply the policy; return the kept segments and what was dropped or cut, by reason.

    - a prompt longer than `max_prompt_length` drops the segment (`prompt_too_long`): cutting a prompt would
      train on a context the policy never saw;
    - a response longer than `max_response_length` is cut at the limit, its mask and logprobs with it, and
      marked `truncated` (`response_truncated` segments, `response_tokens_cut` tokens); turn rewards past
      the cut are dropped; the outcome reward stays (on the last kept token);
    - a segment left without any sampled token is dropped (`no_sampled_tokens`).
    """
    counts: dict[str, int] = {}
    if limits.max_prompt_length is not None:
        too_long = pl.col("prompt_ids").list.len() > limits.max_prompt_length
        counts["prompt_too_long"] = segments.filter(too_long).height
        segments = segments.filter(~too_long)
    if limits.max_response_length is not None:
        cap = limits.max_response_length
        length = pl.col("response_ids").list.len()
        counts["response_truncated"] = segments.filter(length > cap).height
        counts["response_tokens_cut"] = int(segments.select((length - cap).clip(0).sum()).item() or 0)
        segments = segments.with_columns(
            *(pl.col(c).list.head(cap) for c in RESPONSE_COLUMNS),
            truncated=length > cap,
        )
        if "turn_rewards" in segments.columns:
            segments = segments.with_columns(
                pl.col("turn_rewards").list.filter(pl.element().struct.field("position") < cap)
            )
    else:
        segments = segments.with_columns(truncated=pl.lit(False))
    no_sampled = pl.col("response_mask").list.sum() == 0
    counts["no_sampled_tokens"] = segments.filter(no_sampled).height
    return segments.filter(~no_sampled), {k: v for k, v in counts.items() if v}
