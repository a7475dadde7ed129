"""otel-rl: turn the OpenTelemetry traces of agent harnesses into reinforcement-learning training data."""

from otel_rl.lazy_exports import lazy_exports

# The public API, imported on first use so that `otel-rl` sub-commands stay fast to start.
_EXPORTS = {
    "instrument": "otel_rl.sdk",
    "rollout": "otel_rl.sdk",
    "reward": "otel_rl.sdk",
    "query": "otel_rl.query",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
