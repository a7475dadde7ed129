"""What one weight reload did: each server's outcome, every phase's time, and the same-weights check."""

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ServerReload:
    url: str
    ok: bool = False
    error: str | None = None
    weights_changed: bool | None = None
    checksums: dict[str, str] | None = field(default=None, repr=False)
    # Its weights before the load, when no reload verified the current ones (what a failed reload restores)
    checksums_before: dict[str, str] | None = field(default=None, repr=False)


@dataclass
class ReloadResult:
    """What one reload did, and how long each phase took (milliseconds)."""

    version: int
    previous_version: int
    checkpoint: str | None
    lora_adapter: str | None
    servers: list[ServerReload]
    in_flight_at_pause: int = 0
    aborted: int = 0
    drain_ms: float = 0.0
    pause_ms: float = 0.0
    reload_ms: float = 0.0
    verify_ms: float = 0.0
    resume_ms: float = 0.0
    total_ms: float = 0.0
    # Colocated mode (colocated.py): putting the servers to sleep before the update, waking them after it
    sleep_ms: float = 0.0
    wake_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return any(server.ok for server in self.servers)

    @property
    def failed(self) -> list[ServerReload]:
        return [server for server in self.servers if not server.ok]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for server in data["servers"]:
            server.pop("checksums")
            server.pop("checksums_before")
        return data


def check_same_weights(outcomes: list[ServerReload]) -> None:
    """Servers whose weights differ from the majority's fail verification: never serve two versions."""
    verified = [outcome for outcome in outcomes if outcome.ok and outcome.checksums is not None]
    if len(verified) < 2:
        return
    digests = [tuple(sorted(outcome.checksums.items())) for outcome in verified]
    majority = max(set(digests), key=digests.count)
    for outcome, digest in zip(verified, digests, strict=True):
        if digest != majority:
            outcome.ok = False
            outcome.error = "its weights differ from the other servers' after the reload"


def ms_since(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 3)
