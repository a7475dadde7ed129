"""Colocated mode: rollouts and training share the devices; the servers sleep while the trainer updates.

`sleep` holds new calls at the gate, drains those in flight (reload.py) and puts every server to sleep with
vLLM's own endpoint (`POST /sleep?level=1`: weights offloaded to CPU memory, KV cache released), so that the
trainer has the devices; `wake` wakes them (`POST /wake_up`), loads the trainer's checkpoint through the
ordinary reload steps and opens the gate. Calls arriving in between wait at the gate: none reaches a
sleeping server. A sleep not woken within its lease (the trainer died) wakes the servers on their old
weights and opens the gate at the old version. vLLM serves these endpoints when it runs with
`--enable-sleep-mode` and VLLM_SERVER_DEV_MODE=1 (docs/gateway.md#colocated-mode).
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field

from otel_rl.gateway.client import UpstreamClient, UpstreamError
from otel_rl.gateway.metrics import GatewayMetrics
from otel_rl.gateway.reload import ReloadCoordinator, ReloadRejected
from otel_rl.gateway.reload_result import ReloadResult, ServerReload, ms_since

log = logging.getLogger(__name__)

SLEEP_LEVEL = 1  # level 1 keeps the weights in CPU memory: a failed update can wake on them
DEFAULT_SLEEP_LEASE_S = 1800.0  # one update of a large model, with its checkpoint written


@dataclass
class Nap:
    """One colocated update between the servers' sleep and their wake-up."""

    result: ReloadResult
    start_ns: int
    started: float  # perf_counter when the gate closed
    expiry: asyncio.Task | None = field(default=None, repr=False)


class ColocatedUpdates:
    """Sleep and wake over the coordinator's gate; one update at a time, never beside a reload."""

    def __init__(
        self,
        coordinator: ReloadCoordinator,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        *,
        timeout_s: float,
    ) -> None:
        self.coordinator = coordinator
        self.nap: Nap | None = None
        self._client = client
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._ending = asyncio.Lock()  # a wake and an expiry never interleave

    async def sleep(self, *, lease_s: float = DEFAULT_SLEEP_LEASE_S) -> ReloadResult:
        """Hold new calls, drain those in flight, and put every server to sleep."""
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, not {lease_s}")
        if self.nap is not None:
            raise ReloadRejected("the servers already sleep for an update: wake them first")
        if self.coordinator.policy.lora_adapter is not None:
            raise ReloadRejected("the policy is a LoRA adapter: colocated updates load full checkpoints")
        policy = self.coordinator.policy
        start_ns, started = time.time_ns(), time.perf_counter()
        result = ReloadResult(policy.version, policy.version, None, None, [])
        await self.coordinator.hold(result)
        try:
            servers = [s for s in self.coordinator.pool.servers if s.available]
            result.servers = [ServerReload(s.url) for s in servers]
            t = time.perf_counter()
            await asyncio.gather(*(self._sleep_one(s) for s in servers))
            result.sleep_ms = ms_since(t)
        except BaseException:
            self.coordinator.release_hold()
            raise
        nap = Nap(result, start_ns, started)
        nap.expiry = asyncio.create_task(self._expire_after(nap, lease_s))
        self.nap = nap
        log.info("servers asleep for a colocated update (%.0f ms; lease %g s)", result.sleep_ms, lease_s)
        return result

    async def wake(self, *, version: int, checkpoint: str) -> ReloadResult:
        """Wake every server, load `checkpoint` as `version` (the ordinary reload steps), open the gate."""
        async with self._ending:
            nap = self.nap
            if nap is None:
                raise ReloadRejected("no colocated update is open: POST /v1/admin/policy/sleep first")
            if version <= self.coordinator.policy.version:
                raise ReloadRejected(f"version must increase: the current version is {nap.result.version}")
            result = nap.result
            result.version, result.checkpoint = version, checkpoint
            await self._wake_all(result)
            await self.coordinator.apply(result, checkpoint, None)  # its phases' times land in `result`
            return self._end(nap, "woken")

    async def _expire_after(self, nap: Nap, lease_s: float) -> None:
        await asyncio.sleep(lease_s)
        async with self._ending:
            if self.nap is not nap:
                return
            log.error("the colocated update was not woken within %g s: waking on the old weights", lease_s)
            await self._wake_all(nap.result)
            for outcome in nap.result.servers:
                if outcome.ok:
                    await self._resume(outcome)
            self._end(nap, "expired")

    async def _sleep_one(self, server) -> None:
        try:
            await self._post(server.url, "/sleep", params={"level": SLEEP_LEVEL})
        except (UpstreamError, ValueError) as error:
            # Awake, it would hold the devices the trainer needs, and it serves nobody until the next update.
            self.coordinator.pool.take_out(server, f"it could not sleep for a colocated update: {error}")

    async def _wake_all(self, result: ReloadResult) -> None:
        """`POST /wake_up` every server that slept; one that does not wake is taken out."""
        t = time.perf_counter()
        servers = {s.url: s for s in self.coordinator.pool.servers}

        async def wake(outcome: ServerReload) -> None:
            try:
                await self._post(outcome.url, "/wake_up")
                outcome.ok = True
            except (UpstreamError, ValueError) as error:
                outcome.ok, outcome.error = False, f"it did not wake: {error}"
                if outcome.url in servers:
                    self.coordinator.pool.take_out(servers[outcome.url], outcome.error)

        await asyncio.gather(*(wake(o) for o in result.servers))
        result.wake_ms = ms_since(t)

    async def _resume(self, outcome: ServerReload) -> None:
        try:
            await self._post(outcome.url, "/resume")
        except (UpstreamError, ValueError) as error:
            outcome.ok, outcome.error = False, f"it could not resume: {error}"

    def _end(self, nap: Nap, outcome: str) -> ReloadResult:
        """Record the update like any reload (span, metrics, last result) and open the gate."""
        result = nap.result
        if outcome != "woken":
            result.version = result.previous_version
        result.total_ms = ms_since(nap.started)
        self.coordinator.last_result = result
        self.coordinator.record(
            result,
            nap.start_ns,
            **{
                "otel_rl.reload.colocated": outcome,
                "otel_rl.reload.sleep_ms": result.sleep_ms,
                "otel_rl.reload.wake_ms": result.wake_ms,
            },
        )
        self._metrics.count_colocated(result)
        self.nap = None
        if nap.expiry is not None and nap.expiry is not asyncio.current_task():
            nap.expiry.cancel()
        self.coordinator.release_hold()
        log.info("colocated update %s: version %d, paused %.0f ms", outcome, result.version, result.total_ms)
        return result

    async def _post(self, url: str, path: str, **kwargs) -> None:
        status, body = await self._client.request("POST", url + path, timeout_s=self._timeout_s, **kwargs)
        if status != 200:
            raise ValueError(f"{path} answered HTTP {status}: {body[:300].decode(errors='replace')}")
