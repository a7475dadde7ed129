"""ray.util.placement_group, imported by verl/single_controller/ray/base.py."""

from ray import Unavailable, unavailable


class PlacementGroup(Unavailable):
    """ray.util.placement_group.PlacementGroup."""


def placement_group(*args: object, **kwargs: object) -> PlacementGroup:
    raise unavailable("util.placement_group.placement_group")
