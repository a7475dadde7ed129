"""ray.experimental.state.api.get_actor, imported by verl/single_controller/ray/base.py."""

from ray import unavailable


def get_actor(*args: object, **kwargs: object) -> None:
    raise unavailable("experimental.state.api.get_actor")
