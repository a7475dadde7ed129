"""What a harness imports: `instrument()`, `rollout()`, `reward()` (docs/quickstart.md)."""

from otel_rl.sdk.rollout import Rollout, reward, rollout
from otel_rl.sdk.setup import Telemetry, instrument

__all__ = ["Rollout", "Telemetry", "instrument", "reward", "rollout"]
