"""ray.util.collective, imported as a module by verl/checkpoint_engine/delta_checkpoint_engine.py."""


def __getattr__(name: str) -> object:
    raise AttributeError(f"ray.util.collective.{name}: not in the GPU check's stand-in for Ray")
