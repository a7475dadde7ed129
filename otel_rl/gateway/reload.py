"""Synchronized weight reloads: pause, drain, reload and verify every server, switch version, resume.

While a reload runs, new calls wait at the gate (up to `pause_wait_s`, then 503 + Retry-After), so every call
runs entirely under one policy version and says which. A server that fails to reload or to verify is taken
out; the version switches for all remaining servers at once. When every server fails, the version stays:
each server that still holds its weights resumes serving it, and the next reload can try again.
"""

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from otel_rl.attributes import POLICY_VERSION, RELOAD_SPAN_NAME
from otel_rl.gateway.client import UpstreamClient, UpstreamError
from otel_rl.gateway.reload_result import ReloadResult, ServerReload, check_same_weights, ms_since
from otel_rl.gateway.servers import LORA_NAME, InferenceServer, ServerPool, served_adapter, weight_checksums

log = logging.getLogger(__name__)

ABORT_GRACE_S = 10.0  # how long aborted calls may take to return after `/pause?mode=abort`


class GatewayPaused(RuntimeError):
    """A call waited longer than the bound for a reload to finish."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("the gateway is reloading the policy's weights; retry shortly")
        self.retry_after_s = retry_after_s


class ReloadRejected(ValueError):
    """A reload request that cannot be carried out as asked (HTTP 409)."""


@dataclass(frozen=True)
class Policy:
    """The weights every available server serves now."""

    version: int = 0
    checkpoint: str | None = None
    lora_adapter: str | None = None

    @property
    def served_model(self) -> str | None:
        """The model name calls must use on vLLM (the adapter's), or None to keep the client's."""
        return LORA_NAME if self.lora_adapter else None


class ReloadCoordinator:
    """Owns the pause gate, the count of calls in flight, and the current policy."""

    def __init__(
        self,
        pool: ServerPool,
        client: UpstreamClient,
        tracer: Tracer,
        *,
        pause_wait_s: float,
        drain_timeout_s: float,
        reload_timeout_s: float,
    ) -> None:
        self.pool = pool
        self.policy = Policy()
        self.in_flight = 0
        self.last_result: ReloadResult | None = None
        self._client = client
        self._tracer = tracer
        self._pause_wait_s = pause_wait_s
        self._drain_timeout_s = drain_timeout_s
        self._reload_timeout_s = reload_timeout_s
        self._open = asyncio.Event()
        self._open.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._lock = asyncio.Lock()
        self._leased = False  # an external reload (external_reload.py) holds the gate between its requests

    # ------------------------------------------------------------------ the gate

    async def admit(self) -> Policy:
        """Let one call in (waiting while a reload runs); it runs under the returned policy until released."""
        while not self._open.is_set():
            try:  # asyncio.timeout: on Python 3.11 wait_for can lose a cancel (cluster.py's `changed`)
                async with asyncio.timeout(self._pause_wait_s):
                    await self._open.wait()
            except TimeoutError:
                raise GatewayPaused(retry_after_s=1.0) from None
        self.in_flight += 1
        self._drained.clear()
        return self.policy

    def release(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._drained.set()

    # ------------------------------------------------------------------ the reload

    async def reload(self, *, version: int, checkpoint: str | None, lora_adapter: str | None) -> ReloadResult:
        """Switch every server to new weights; one reload at a time."""
        if (checkpoint is None) == (lora_adapter is None):
            raise ReloadRejected("give exactly one of 'checkpoint' (a model folder) or 'lora_adapter'")
        if self._leased:
            raise ReloadRejected("an external weight update holds the gateway: commit or abort its lease")
        async with self._lock:
            if version <= self.policy.version:
                raise ReloadRejected(f"version must increase: the current version is {self.policy.version}")
            start_ns = time.time_ns()
            start = time.perf_counter()
            result = ReloadResult(version, self.policy.version, checkpoint, lora_adapter, [])
            self._open.clear()
            try:
                await self._drain(result)
                await self.apply(result, checkpoint, lora_adapter)
            finally:
                self._open.set()
                result.total_ms = ms_since(start)
            self.last_result = result
            self.record(result, start_ns)
            return result

    async def apply(self, result: ReloadResult, checkpoint: str | None, lora_adapter: str | None) -> None:
        """Load the new weights on every server and switch to them, the gate held and the calls drained."""
        servers = [s for s in self.pool.servers if s.healthy or s.out_reason is not None]
        result.servers = [ServerReload(s.url) for s in servers]
        await self._reload_all(servers, result, checkpoint, lora_adapter)
        if result.ok:
            self.switch(servers, result)
        else:
            await self._keep_serving(servers, result)

    @property
    def busy(self) -> bool:
        """Whether a reload runs or an external reload's lease holds the gate."""
        return self._lock.locked()

    async def hold(self, result: ReloadResult) -> None:
        """An external reload's pause: take the reload lock, hold new calls at the gate, drain the others.

        The gate stays closed across requests until `release_hold`; the caller records its steps in `result`.
        """
        if self._lock.locked():
            raise ReloadRejected("a weight reload is running: pause after it")
        await self._lock.acquire()
        self._leased = True
        self._open.clear()
        try:
            await self._drain(result)
        except BaseException:
            self.release_hold()
            raise

    def release_hold(self) -> None:
        """An external reload's end: open the gate and the reload lock."""
        self._leased = False
        self._open.set()
        self._lock.release()

    async def _drain(self, result: ReloadResult) -> None:
        result.in_flight_at_pause = self.in_flight
        t = time.perf_counter()
        try:
            async with asyncio.timeout(self._drain_timeout_s):
                await self._drained.wait()
        except TimeoutError:
            result.aborted = self.in_flight
            log.warning("drain deadline passed: aborting %d calls in flight", self.in_flight)
            live = [s for s in self.pool.servers if s.healthy]
            await asyncio.gather(
                *(self._post(s.url, "/pause", params={"mode": "abort"}) for s in live), return_exceptions=True
            )
            try:
                async with asyncio.timeout(ABORT_GRACE_S):
                    await self._drained.wait()
            except TimeoutError:
                # vLLM has stopped generating for them; what is left is relaying to slow clients.
                log.warning("%d aborted calls are still being relayed", self.in_flight)
        result.drain_ms = ms_since(t)

    async def _reload_all(
        self, servers: list[InferenceServer], result: ReloadResult, checkpoint: str | None, lora: str | None
    ) -> None:
        # Each server goes through its steps at its own pace (no barrier between servers until the switch);
        # a phase's time in the result is the slowest server's.
        outcomes = list(zip(servers, result.servers, strict=True))
        phases = await asyncio.gather(*(self._reload_one(s.url, o, checkpoint, lora) for s, o in outcomes))
        for phase in ("pause", "reload", "verify"):
            setattr(result, f"{phase}_ms", max((p.get(phase, 0.0) for p in phases), default=0.0))
        check_same_weights(result.servers)
        # A server that failed stays paused on vLLM too: nobody can reach its stale weights.
        t = time.perf_counter()
        await asyncio.gather(*(self._guard(o, self._post(s.url, "/resume")) for s, o in outcomes))
        result.resume_ms = ms_since(t)

    async def _reload_one(
        self, url: str, outcome: ServerReload, checkpoint: str | None, lora: str | None
    ) -> dict[str, float]:
        """Pause, load, then reset the prefix cache and verify at once; a failure marks the outcome."""
        phases: dict[str, float] = {}
        try:
            t = time.perf_counter()
            await self._post(url, "/pause", params={"mode": "wait"})
            if checkpoint is not None and self.pool.reference_checksums is None:
                outcome.checksums_before = await weight_checksums(self._client, url, self._reload_timeout_s)
            phases["pause"] = ms_since(t)
            t = time.perf_counter()
            await self._load(url, checkpoint, lora)
            phases["reload"] = ms_since(t)
            t = time.perf_counter()
            # Resetting the prefix cache is mandatory: prefixes cached under the old weights would be reused.
            # It and the verification both only read or drop state, so they run concurrently (one hop less).
            reset, verified = await asyncio.gather(
                self._post(url, "/reset_prefix_cache"), self._verify(url, lora), return_exceptions=True
            )
            for error in (reset, verified):
                if isinstance(error, BaseException):
                    raise error
            outcome.checksums = verified
            before = self.pool.reference_checksums or outcome.checksums_before
            if verified is not None:
                outcome.weights_changed = None if before is None else verified != before
            outcome.ok = True
            phases["verify"] = ms_since(t)
        except (UpstreamError, KeyError, ValueError) as error:
            outcome.ok = False
            outcome.error = f"{type(error).__name__}: {error}"
        return phases

    async def _guard(self, outcome: ServerReload, step) -> None:
        """Run one server's step unless an earlier one failed; a failure marks the server's outcome."""
        if outcome.error is not None:
            step.close()
            return
        try:
            await step
        except (UpstreamError, KeyError, ValueError) as error:
            outcome.ok = False
            outcome.error = f"{type(error).__name__}: {error}"

    async def _load(self, url: str, checkpoint: str | None, lora: str | None) -> None:
        if checkpoint is not None:
            await self._post(
                url,
                "/collective_rpc",
                json={"method": "reload_weights", "kwargs": {"weights_path": checkpoint}},
            )
            if self.policy.lora_adapter is not None:  # the adapter policy ends: nobody may call it any more
                await self._post(
                    url, "/v1/unload_lora_adapter", json={"lora_name": LORA_NAME}, missing_ok=True
                )
        else:
            await self._post(
                url,
                "/v1/load_lora_adapter",
                json={"lora_name": LORA_NAME, "lora_path": lora, "load_inplace": True},
            )

    async def _verify(self, url: str, lora: str | None) -> dict[str, str] | None:
        """The server's weight checksums (a checkpoint), or None once it lists the adapter at its new path."""
        if lora is None:
            return await weight_checksums(self._client, url, self._reload_timeout_s)
        served = await served_adapter(self._client, url, self._reload_timeout_s)
        if served != lora:
            raise ValueError(f"the server lists adapter {served!r}, not {lora!r}")
        return None

    def switch(self, servers: list[InferenceServer], result: ReloadResult) -> None:
        """Take out the servers that failed; the others serve the new version from now on."""
        for server, outcome in zip(servers, result.servers, strict=True):
            if outcome.ok:
                server.out_reason = None
                server.healthy = True
            else:
                self.pool.take_out(server, f"reload to version {result.version} failed: {outcome.error}")
        good = [outcome for outcome in result.servers if outcome.ok]
        if not good:
            log.error("reload to version %d failed on every server; no server is available", result.version)
            return
        if good[0].checksums is not None:
            self.pool.reference_checksums = good[0].checksums
        self.pool.reference_adapter = result.lora_adapter
        self.policy = Policy(result.version, result.checkpoint, result.lora_adapter)

    async def _keep_serving(self, servers: list[InferenceServer], result: ReloadResult) -> None:
        """Every server failed the reload: the policy stays, and each server that provably still holds its
        weights resumes it (the others are taken out, as a failed server always is)."""
        kept = 0
        for server, outcome in zip(servers, result.servers, strict=True):
            why_not = await self._holds_policy(server.url, outcome, result)
            if why_not is None:
                try:
                    await self._post(server.url, "/resume")
                except (UpstreamError, ValueError) as error:
                    why_not = f"it could not resume: {error}"
            if why_not is None:
                kept += 1
            else:
                reason = f"reload to version {result.version} failed: {outcome.error}; {why_not}"
                self.pool.take_out(server, reason)
        log.error(
            "reload to version %d failed on every server; version %d stays, on %d of %d servers",
            result.version,
            self.policy.version,
            kept,
            len(servers),
        )

    async def _holds_policy(self, url: str, outcome: ServerReload, result: ReloadResult) -> str | None:
        """Why the server may no longer serve the current policy after a failed reload; None when it does."""
        try:
            if result.checkpoint is not None:  # a checkpoint loads the base weights: they must be unchanged
                expected = self.pool.reference_checksums or outcome.checksums_before
                if expected is None:
                    return "its weights before the reload are unknown"
                if await weight_checksums(self._client, url, self._reload_timeout_s) != expected:
                    return "its weights changed"
            served = await served_adapter(self._client, url, self._reload_timeout_s)
        except (UpstreamError, KeyError, ValueError) as error:
            return f"its weights could not be checked: {error}"
        if served != self.policy.lora_adapter:
            return f"it serves adapter {served!r}, not the policy's {self.policy.lora_adapter!r}"
        return None

    async def _post(self, url: str, path: str, *, missing_ok: bool = False, **kwargs: Any) -> bytes:
        """POST to a server; `missing_ok`: a 404 (what is to be removed is not there) is a success."""
        status, body = await self._client.request(
            "POST", url + path, timeout_s=self._reload_timeout_s, **kwargs
        )
        if status != 200 and not (missing_ok and status == 404):
            raise ValueError(f"{path} answered HTTP {status}: {body[:300].decode(errors='replace')}")
        return body

    def record(self, result: ReloadResult, start_ns: int, **extra: Any) -> None:
        """Store the reload as an `otel_rl.reload` span (`extra`: more attributes: an external outcome)."""
        attributes: dict[str, Any] = {
            POLICY_VERSION: result.version,
            "otel_rl.policy.previous_version": result.previous_version,
            "otel_rl.reload.servers": [server.url for server in result.servers],
            "otel_rl.reload.failed_servers": [server.url for server in result.failed],
            "otel_rl.reload.in_flight_at_pause": result.in_flight_at_pause,
            "otel_rl.reload.aborted": result.aborted,
            **extra,
        }
        for phase in ("drain", "pause", "reload", "verify", "resume", "total"):
            attributes[f"otel_rl.reload.{phase}_ms"] = getattr(result, f"{phase}_ms")
        if result.checkpoint:
            attributes["otel_rl.reload.checkpoint"] = result.checkpoint
        if result.lora_adapter:
            attributes["otel_rl.reload.lora_adapter"] = result.lora_adapter
        span = self._tracer.start_span(
            RELOAD_SPAN_NAME, kind=SpanKind.INTERNAL, attributes=attributes, start_time=start_ns
        )
        if result.failed:
            errors = "; ".join(f"{server.url}: {server.error}" for server in result.failed)
            span.set_status(Status(StatusCode.ERROR, errors))
        span.end()
