"""The HTTP port's connection caps and read deadlines, and the count of connections open per client address.

uvicorn bounds neither how long a client may take to send its headers nor how many connections it holds:
an idle or trickling connection stays open for ever (its keep-alive timer only runs between requests), and
enough of them exhaust the process's file descriptors, which the gRPC receiver and the store share.
otel_rl/guarded_http.py enforces these limits in uvicorn's HTTP protocol.
"""

import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

# In the scope of a request whose connection the server closed for its slowness: why (read_body logs it)
CUT_REASON = "otel_rl.connection_cut"
REFUSAL_LOG_INTERVAL_S = 10.0  # refused connections are logged as one count per interval, not one line each


class ConnectionLimits(BaseModel):
    """What one client, and all clients together, may hold of the HTTP port (docs/security.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_connections: int = Field(4096, ge=1)
    max_connections_per_client: int = Field(512, ge=1)
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(30.0, gt=0)
    max_header_bytes: int = Field(64 * 1024, ge=1)


def descriptor_budget(max_connections: int, *, share: int = 2) -> int:
    """`max_connections`, or 1/`share` of the process's file-descriptor limit when that is lower. The HTTP
    port takes a half, gRPC a quarter; the rest stays for the store's files, the upstream connections and
    the connections refused as they come."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft // share))


def raise_descriptor_limit() -> None:
    """Raise the soft file-descriptor limit to the hard one (often 1024 → 500,000+): room for more clients."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class ConnectionCounts:
    """The connections open now, per client address, shared by every connection of one server."""

    limits: ConnectionLimits
    max_connections: int  # limits.max_connections within the file-descriptor budget
    per_client: Counter = field(default_factory=Counter)
    total: int = 0
    refused: int = 0
    _logged_at: float = 0.0

    @classmethod
    def within_descriptors(cls, limits: ConnectionLimits) -> "ConnectionCounts":
        return cls(limits, descriptor_budget(limits.max_connections))

    def admit(self, client: str) -> str | None:
        """Count one more connection from `client`; why it is refused instead (then it is not counted)."""
        if self.total >= self.max_connections:
            return self._refuse(f"{self.total} connections are open, the server's limit (--max-connections)")
        if self.per_client[client] >= self.limits.max_connections_per_client:
            return self._refuse(
                f"{client} holds {self.per_client[client]} connections, the limit per client address"
                " (--max-connections-per-client)"
            )
        self.per_client[client] += 1
        self.total += 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]

    def _refuse(self, why: str) -> str:
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at >= REFUSAL_LOG_INTERVAL_S:
            log.warning("refusing HTTP connections (%d so far): %s", self.refused, why)
            self._logged_at = now
        return why
