"""Rollout controller: runs the user's harness once per rollout, with the rollout's identity and keys."""

from otel_rl.controller.local import Controller, ControllerSettings
from otel_rl.controller.rollouts import (
    AttemptResult,
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
