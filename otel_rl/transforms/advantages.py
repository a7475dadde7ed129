"""Group advantages over rollouts with verl's estimators, broadcast to segments; per-rollout loss weights."""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl

Estimator = Literal["grpo", "grpo_no_std", "rloo"]
ESTIMATORS: tuple[str, ...] = ("grpo", "grpo_no_std", "rloo")


def rollout_advantages(rollouts: pl.DataFrame, estimator: Estimator = "grpo") -> pl.DataFrame:
    """Add `advantage` to one-row-per-rollout `rollouts` (`group_id`, `reward`), grouped by `group_id`.

    verl's outcome estimators take one scalar score per sequence: here a sequence is a rollout, so a rollout
    that split into several segments still counts once in its group's baseline.
    `grpo`: (r - mean) / (std + 1e-6); `grpo_no_std` (Dr. GRPO): r - mean; `rloo`: leave-one-out baseline.
    A rollout without a group is its own group, and verl gives a one-rollout group mean 0 (std 1): its
    advantage is its reward.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}: use one of {', '.join(ESTIMATORS)}")
    if rollouts.height == 0:
        return rollouts.with_columns(advantage=pl.lit(None, dtype=pl.Float64))
    import torch
    from verl.trainer.ppo import core_algos

    scores = torch.tensor(rollouts["reward"].to_numpy(), dtype=torch.float32).unsqueeze(-1)
    ones = torch.ones_like(scores)
    index = rollouts.select(pl.coalesce("group_id", "rollout_id")).to_series().to_numpy().astype(object)
    if estimator == "rloo":
        advantages, _ = core_algos.compute_rloo_outcome_advantage(scores, ones, index)
    else:
        advantages, _ = core_algos.compute_grpo_outcome_advantage(
            scores, ones, index, norm_adv_by_std_in_grpo=estimator == "grpo"
        )
    return rollouts.with_columns(advantage=pl.Series(advantages.squeeze(-1).numpy().astype(np.float64)))


def loss_weights(segments: pl.DataFrame) -> pl.DataFrame:
    """Add `loss_weight` = 1 / (the rollout's segments kept): each rollout's segments weigh 1 in total."""
    return segments.with_columns(loss_weight=(1.0 / pl.len().over("rollout_id")).cast(pl.Float64))
