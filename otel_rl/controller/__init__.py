"""Rollout controller: runs the user's harness once per rollout, with the rollout's identity and keys."""

from otel_rl.controller.local import (
    AttemptResult,
    Controller,
    ControllerSettings,
    Rollout,
    RolloutResult,
    RolloutStatus,
    group_rollouts,
    new_id,
)

__all__ = [
    "AttemptResult",
    "Controller",
    "ControllerSettings",
    "Rollout",
    "RolloutResult",
    "RolloutStatus",
    "group_rollouts",
    "new_id",
]
