"""verl's distributed engine as otel-rl's training backend (`backend: verl`; docs/verl.md)."""

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy: validating a config imports otel_rl.train.verl.config, without the trainer's heavy imports.
    if name == "VerlTrainer":
        from otel_rl.train.verl.trainer import VerlTrainer

        return VerlTrainer
    raise AttributeError(name)
