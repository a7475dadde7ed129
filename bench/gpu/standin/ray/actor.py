"""ray.actor: ActorHandle, named in annotations (verl/single_controller/ray/base.py, rollout/replica.py)."""

from ray import Unavailable


class ActorHandle(Unavailable):
    """ray.actor.ActorHandle."""
