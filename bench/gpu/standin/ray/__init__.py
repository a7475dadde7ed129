"""A stand-in for Ray, for import-time references only (the GPU machine has no Ray, too big to carry).

`verl/protocol.py`, which `import verl` runs, imports ray, and modules on the engine's import path name a few
of its objects at import time (annotations, base classes, `@ray.remote` on module-level functions, classes).
These are exactly the names verl 0.9.1 touches on that path; anything used at run time raises RayUnavailable,
so a code path that really needs Ray fails loudly instead of silently doing nothing.
"""


class RayUnavailable(RuntimeError):
    """Ray was called at run time; the GPU check runs verl's engine in one process, without Ray."""


def unavailable(name: str) -> RayUnavailable:
    return RayUnavailable(f"ray.{name} was called, but this is the GPU check's stand-in for Ray, not Ray")


class Unavailable:
    """A Ray type named in annotations or as a base; making one is a run-time use."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise unavailable(type(self).__qualname__)


class ObjectRef(Unavailable):
    """ray.ObjectRef (verl/protocol.py annotates DataProtoFuture with it)."""


class RemoteFunction:
    """What `@ray.remote` makes of a function or class at import time; launching it is a run-time use."""

    def __init__(self, target: object) -> None:
        self.target = target

    def remote(self, *args: object, **kwargs: object) -> None:
        raise unavailable(f"remote({getattr(self.target, '__qualname__', self.target)}).remote")

    def options(self, *args: object, **kwargs: object) -> None:
        raise unavailable(f"remote({getattr(self.target, '__qualname__', self.target)}).options")


def remote(*args: object, **kwargs: object) -> object:
    """`@ray.remote` and `ray.remote(cls)` (verl/single_controller/ray/base.py, checkpoint_engine/base.py)."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return RemoteFunction(args[0])
    return RemoteFunction  # `@ray.remote(num_cpus=...)`: the decorator


def __getattr__(name: str) -> object:
    raise AttributeError(f"ray.{name}: not in the GPU check's stand-in for Ray (verl used it at run time)")


# After the names above: the submodules import them.
from ray import actor, experimental, util  # noqa: E402

__all__ = ["ObjectRef", "RayUnavailable", "actor", "experimental", "remote", "util"]
