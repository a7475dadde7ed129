"""ray.util.scheduling_strategies, imported by verl/single_controller/ray/base.py."""

from ray import Unavailable


class NodeAffinitySchedulingStrategy(Unavailable):
    """ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy."""


class PlacementGroupSchedulingStrategy(Unavailable):
    """ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy."""
