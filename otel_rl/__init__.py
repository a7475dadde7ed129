"""otel-rl: turn the OpenTelemetry traces of agent harnesses into reinforcement-learning training data."""

from importlib import import_module
from typing import Any

# The public API, imported on first use so that `otel-rl` sub-commands stay fast to start.
_EXPORTS = {
    "instrument": "otel_rl.sdk",
    "rollout": "otel_rl.sdk",
    "reward": "otel_rl.sdk",
    "query": "otel_rl.query",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'otel_rl' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
