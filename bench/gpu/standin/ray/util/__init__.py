"""ray.util: the submodules verl imports (placement groups, scheduling strategies, collectives)."""

from ray.util import collective, placement_group, scheduling_strategies

__all__ = ["collective", "placement_group", "scheduling_strategies"]
