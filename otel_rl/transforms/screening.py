"""Screening: the rollouts the hack detectors flagged (the `hack_flags` view) are left out of training samples
and counted, never scored: a flag is not a learned penalty (docs/coding.md "Detectors")."""

from __future__ import annotations

import polars as pl

from otel_rl.store import reads
from otel_rl.store.reads import FLAGS_COLUMN


def with_flags(rollouts: pl.DataFrame, run: reads.Run) -> pl.DataFrame:
    """`rollouts` with their detectors (FLAGS_COLUMN), read from the store by `run`."""
    flags = reads.hack_flags(run, rollouts["rollout_id"].to_list())
    flags = flags.select(pl.col("rollout_id").cast(pl.String), pl.col(FLAGS_COLUMN).cast(pl.List(pl.String)))
    return rollouts.join(flags, on="rollout_id", how="left")


def screen(rollouts: pl.DataFrame) -> tuple[pl.DataFrame, int, dict[str, int]]:
    """(the rollouts no detector flagged, how many were flagged, flagged rollouts by detector). Rollouts read
    without their flags (no FLAGS_COLUMN) are all kept."""
    if FLAGS_COLUMN not in rollouts.columns:
        return rollouts, 0, {}
    flagged = rollouts.filter(pl.col(FLAGS_COLUMN).is_not_null())
    by_detector = (
        flagged.select(pl.col(FLAGS_COLUMN).explode().alias("detector"))
        .group_by("detector")
        .len()
        .sort("detector")
    )
    kept = rollouts.filter(pl.col(FLAGS_COLUMN).is_null()).drop(FLAGS_COLUMN)
    return kept, flagged.height, dict(by_detector.iter_rows())
