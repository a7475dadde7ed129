"""Reloads whose weights someone else moves (verl's checkpoint engine): pause, then commit or abort.

`pause` holds new calls and drains those in flight as a reload does (reload.py) and answers with a lease;
the trainer then moves the weights into the servers itself; `commit` verifies that every server serves the
same new weights, switches to the next version and resumes; `abort` resumes on the old version the servers
whose weights did not move. A lease neither committed nor aborted in time expires: the gate opens and every
server of the lease is taken out, since the weights may still be moving under it (unknown weights are never
served under a version they may not be); the next commit brings back those that hold its weights.
"""

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Literal

from otel_rl.gateway.client import UpstreamClient, UpstreamError
from otel_rl.gateway.metrics import GatewayMetrics
from otel_rl.gateway.reload import ReloadCoordinator, ReloadRejected
from otel_rl.gateway.reload_result import ReloadResult, ServerReload, check_same_weights, ms_since
from otel_rl.gateway.servers import InferenceServer, weight_checksums

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 600.0  # verl's NCCL update of a 7B model takes well under a minute
MAX_LEASE_S = 3600.0
Outcome = Literal["committed", "unchanged", "aborted", "expired"]


class LeaseUnknown(ReloadRejected):
    """A commit or abort names no open lease (expired, already ended, or never issued): HTTP 409."""


@dataclass
class Lease:
    """One external reload between its pause and its end."""

    id: str
    servers: list[InferenceServer]
    result: ReloadResult
    old_weights: dict[str, str] | None  # what the servers held at the pause (None: could not be read)
    lease_s: float
    start_ns: int
    started: float  # perf_counter at the pause's start
    paused: float = 0.0  # perf_counter when the pause answered
    expiry: asyncio.Task | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        result = self.result
        return {
            "lease": self.id,
            "version": result.version,
            "previous_version": result.previous_version,
            "lease_s": self.lease_s,
            "servers": [server.url for server in self.servers],
            "in_flight_at_pause": result.in_flight_at_pause,
            "aborted": result.aborted,
            "drain_ms": result.drain_ms,
            "pause_ms": result.pause_ms,
        }


class ExternalReloads:
    """The lease protocol over the coordinator's gate; one lease at a time, never beside a reload."""

    def __init__(
        self,
        coordinator: ReloadCoordinator,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        *,
        timeout_s: float,
    ) -> None:
        self.coordinator = coordinator
        self.lease: Lease | None = None
        self._client = client
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._ending = asyncio.Lock()  # a commit, an abort and an expiry of one lease never interleave

    async def pause(self, *, version: int | None, lease_s: float) -> Lease:
        """Hold new calls, drain those in flight, and lease the servers to whoever moves the weights."""
        if not 0 < lease_s <= MAX_LEASE_S:
            raise ValueError(f"lease_s must be > 0 and at most {MAX_LEASE_S:g} seconds, not {lease_s}")
        policy = self.coordinator.policy
        if policy.lora_adapter is not None:
            raise ReloadRejected("the policy is a LoRA adapter: an external update moves full weights only")
        target = policy.version + 1 if version is None else version
        if target <= policy.version:
            raise ReloadRejected(f"version must increase: the current version is {policy.version}")
        start_ns, started = time.time_ns(), time.perf_counter()
        result = ReloadResult(target, policy.version, None, None, [])
        await self.coordinator.hold(result)
        try:
            pool = self.coordinator.pool
            servers = [s for s in pool.servers if s.healthy or s.out_reason is not None]
            if not servers:
                raise ReloadRejected("no inference server to update: register verl's replicas first")
            result.servers = [ServerReload(server.url) for server in servers]
            t = time.perf_counter()
            old = pool.reference_checksums or await self._first_weights(servers)
            result.pause_ms = ms_since(t)
        except BaseException:
            self.coordinator.release_hold()
            raise
        lease = Lease(secrets.token_hex(16), servers, result, old, lease_s, start_ns, started)
        lease.paused = time.perf_counter()
        lease.expiry = asyncio.create_task(self._expire_after(lease))
        self.lease = lease
        log.info("paused for an external update to version %d (lease %s, %g s)", target, lease.id, lease_s)
        return lease

    async def commit(self, lease_id: str) -> tuple[ReloadResult, Outcome]:
        """Verify the moved weights; the servers holding them serve the next version, the others leave."""
        async with self._ending:
            lease = self._open_lease(lease_id)
            result = lease.result
            result.reload_ms = ms_since(lease.paused)
            await self._verify(lease)
            moved = [o for o in result.servers if o.ok and o.weights_changed is not False]
            if not moved:
                self._stay_on_old_weights(lease, "its weights did not change: the update reached no server")
                await self._resume(lease)
                return self._end(lease, "unchanged"), "unchanged"
            for outcome in result.servers:
                if outcome.ok and outcome.weights_changed is False:
                    outcome.ok, outcome.error = False, "its weights did not change while the others' did"
            check_same_weights(result.servers)
            await self._resume(lease)
            self.coordinator.switch(lease.servers, result)
            return self._end(lease, "committed"), "committed"

    async def abort(self, lease_id: str) -> tuple[ReloadResult, Outcome]:
        """The weights did not move (or not everywhere): the servers that still hold the old ones resume."""
        async with self._ending:
            lease = self._open_lease(lease_id)
            lease.result.reload_ms = ms_since(lease.paused)
            await self._verify(lease)
            self._stay_on_old_weights(lease, "its weights changed or could not be read in an aborted update")
            await self._resume(lease)
            return self._end(lease, "aborted"), "aborted"

    # ------------------------------------------------------------------ the steps

    def _open_lease(self, lease_id: str) -> Lease:
        lease = self.lease
        if lease is None or not secrets.compare_digest(lease.id.encode(), lease_id.encode()):
            raise LeaseUnknown(f"no open lease {lease_id!r}: it expired or ended (see GET /v1/admin/policy)")
        return lease  # its expiry still runs: a commit that fails unexpectedly cannot hold the gate for good

    async def _expire_after(self, lease: Lease) -> None:
        await asyncio.sleep(lease.lease_s)
        async with self._ending:
            if self.lease is not lease:
                return
            reason = (
                f"the lease of the update to version {lease.result.version} expired: its weights are unknown"
            )
            for server, outcome in zip(lease.servers, lease.result.servers, strict=True):
                outcome.ok, outcome.error = False, reason
                self.coordinator.pool.take_out(server, reason)
            self._end(lease, "expired")

    async def _verify(self, lease: Lease) -> None:
        """Every server's checksums, with its prefix cache reset (prefixes cached under old weights)."""
        t = time.perf_counter()
        await asyncio.gather(
            *(
                self._verify_one(s.url, o, lease.old_weights)
                for s, o in zip(lease.servers, lease.result.servers, strict=True)
            )
        )
        lease.result.verify_ms = ms_since(t)

    async def _verify_one(self, url: str, outcome: ServerReload, old: dict[str, str] | None) -> None:
        try:
            reset, checksums = await asyncio.gather(
                self._post(url, "/reset_prefix_cache"),
                weight_checksums(self._client, url, self._timeout_s),
                return_exceptions=True,
            )
            for error in (reset, checksums):
                if isinstance(error, BaseException):
                    raise error
            outcome.checksums = checksums
            outcome.weights_changed = None if old is None else checksums != old
            outcome.ok = True
        except (UpstreamError, KeyError, TypeError, ValueError) as error:
            outcome.ok, outcome.error = False, f"{type(error).__name__}: {error}"

    def _stay_on_old_weights(self, lease: Lease, why_out: str) -> None:
        """The version stays: servers still holding the old weights stay in, the others are taken out."""
        result = lease.result
        for server, outcome in zip(lease.servers, result.servers, strict=True):
            if outcome.ok and lease.old_weights is not None and outcome.checksums == lease.old_weights:
                server.out_reason, server.healthy = None, True
                continue
            outcome.ok, outcome.error = False, outcome.error or why_out
            self.coordinator.pool.take_out(server, f"update to version {result.version}: {outcome.error}")

    async def _resume(self, lease: Lease) -> None:
        """`POST /resume` the servers that stay (the drain may have paused vLLM); a failure takes one out."""
        t = time.perf_counter()

        async def resume(outcome: ServerReload) -> None:
            try:
                await self._post(outcome.url, "/resume")
            except (UpstreamError, ValueError) as error:
                outcome.ok, outcome.error = False, f"{type(error).__name__}: {error}"

        await asyncio.gather(*(resume(o) for o in lease.result.servers if o.ok))
        lease.result.resume_ms = ms_since(t)

    def _end(self, lease: Lease, outcome: Outcome) -> ReloadResult:
        """Record the reload like any other (span, metrics, last result) and open the gate."""
        result = lease.result
        for server, report in zip(lease.servers, result.servers, strict=True):
            if not report.ok and server.out_reason is None:
                self.coordinator.pool.take_out(server, f"update to version {result.version}: {report.error}")
        if outcome != "committed":  # the policy stays: the report says so
            result.version = result.previous_version
        result.total_ms = ms_since(lease.started)
        self.coordinator.last_result = result
        self.coordinator.record(result, lease.start_ns, **{"otel_rl.reload.external": outcome})
        self._metrics.count_reload(
            result
        )  # the span's `otel_rl.reload.external` tells an abort from a commit
        self.lease = None
        if lease.expiry is not None and lease.expiry is not asyncio.current_task():
            lease.expiry.cancel()
        self.coordinator.release_hold()
        log.info("external update ended: %s at version %d", outcome, self.coordinator.policy.version)
        return result

    async def _first_weights(self, servers: list[InferenceServer]) -> dict[str, str] | None:
        """The old weights when no reload has set them yet: those of the first server that answers."""
        for server in servers:
            try:
                return await weight_checksums(self._client, server.url, self._timeout_s)
            except (UpstreamError, KeyError, TypeError, ValueError) as error:
                log.warning("could not read the weights of %s at the pause: %s", server.url, error)
        return None

    async def _post(self, url: str, path: str) -> None:
        status, body = await self._client.request("POST", url + path, timeout_s=self._timeout_s)
        if status != 200:
            raise ValueError(f"{path} answered HTTP {status}: {body[:300].decode(errors='replace')}")
