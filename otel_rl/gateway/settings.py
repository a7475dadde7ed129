"""Typed settings of the gateway (inference servers, per-split sampling, reload and timeout bounds)."""

from dataclasses import dataclass, field
from typing import Any

# What the trainer assumes for train rollouts: samples from the policy's full distribution, so that the
# recorded logprobs are the policy's (top_k -1 = off, as vLLM spells it).
DEFAULT_SPLIT_SAMPLING: dict[str, dict[str, Any]] = {"train": {"temperature": 1.0, "top_p": 1.0, "top_k": -1}}


@dataclass(frozen=True)
class GatewaySettings:
    """How the gateway routes, samples, records and reloads."""

    servers: tuple[str, ...] = ()  # base URLs of vLLM servers (http://127.0.0.1:8000)
    # Sampling parameters forced per split (the rollout's `otel_rl.split`); other splits send the client's.
    split_sampling: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(DEFAULT_SPLIT_SAMPLING))
    upstream_timeout_s: float = 600.0  # one model call (a long generation is legitimate)
    connect_timeout_s: float = 5.0
    health_interval_s: float = 2.0
    pause_wait_s: float = 30.0  # how long a new request waits for a reload before 503 + Retry-After
    drain_timeout_s: float = 30.0  # how long a reload waits for in-flight calls before aborting them
    reload_timeout_s: float = 300.0  # one server's reload_weights / load_lora_adapter
    forward_otlp: str | None = None  # also send the gateway's spans to this OTLP/HTTP traces endpoint
    span_flush_ms: int = 50  # batch delay of the span exporter (the trainer waits for spans)

    def __post_init__(self) -> None:
        for split, params in self.split_sampling.items():
            if not isinstance(params, dict):
                raise ValueError(f"split_sampling[{split!r}] must be an object of sampling parameters")
        for name in ("upstream_timeout_s", "connect_timeout_s", "health_interval_s", "reload_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
