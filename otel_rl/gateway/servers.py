"""The vLLM servers behind the gateway: health, routing by calls in flight, sticky rollouts, taking a failed
server out.

A server leaves the pool after CONNECT_FAILURES_TO_LEAVE connects or health probes in a row fail to reach it
in time, or at once when a probe is refused or answered with an error; it rejoins at its next successful probe
(which also checks that it serves the current policy's weights).
"""

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

import orjson

from otel_rl.gateway.client import UpstreamClient, UpstreamError

log = logging.getLogger(__name__)

LORA_NAME = "otel-rl-policy"  # the name vLLM serves the policy's LoRA adapter under
# One refused or slow connect is a hiccup (a restart, a full accept queue); three in a row is a server down.
CONNECT_FAILURES_TO_LEAVE = 3
FIRST_RETRY_DELAY_S = 0.05
MAX_RETRY_DELAY_S = 1.0
# The rollouts whose server the pool remembers (the most recently called); an older one's next call is placed
# again, as a new rollout's is: it only loses that server's prefix cache.
ROLLOUTS_REMEMBERED = 100_000


class NoServerAvailable(RuntimeError):
    """No inference server can take a call (all unhealthy or taken out)."""


def retry_delay_s(attempt: int) -> float:
    """How long a call waits before its `attempt`-th retry (from 0) to connect: 50 ms, doubling, up to 1 s."""
    return min(FIRST_RETRY_DELAY_S * 2**attempt, MAX_RETRY_DELAY_S)


@dataclass(eq=False)
class InferenceServer:
    """One vLLM server and what the gateway knows of it."""

    url: str
    healthy: bool = True  # in the pool: answered its last probe, and fewer connects than the bound failed
    out_reason: str | None = None  # taken out by a failed reload: serves stale weights until the next one
    failure: str | None = None  # why it last failed a connect or a probe (for logs and 503s)
    consecutive_connect_failures: int = 0
    in_flight: int = 0
    routed: int = 0  # calls the pool sent here: among servers equally busy, the one with fewest gets the next

    @property
    def available(self) -> bool:
        return self.healthy and self.out_reason is None

    @property
    def may_return(self) -> bool:
        """Whether a call may wait for it: down, but not taken out (a reload would have to bring it back)."""
        return not self.healthy and self.out_reason is None

    def connect_failed(self, failure: str) -> bool:
        """Count a failed connect (nothing reached vLLM) or a probe not answered in time; True when it makes
        the server leave the pool."""
        self.failure = failure
        self.consecutive_connect_failures += 1
        left = self.healthy and self.consecutive_connect_failures >= CONNECT_FAILURES_TO_LEAVE
        if left:
            self.healthy = False
        return left

    def probed(self, failure: str | None) -> None:
        """The outcome of a health probe: None if it answered and serves the policy, else why not."""
        self.failure = failure
        self.healthy = failure is None
        if self.healthy:
            self.consecutive_connect_failures = 0

    def state(self) -> str:
        return f"{self.url} ({self.out_reason or self.failure or 'unhealthy'})"


class ServerPool:
    """Picks a server per call: the one with the fewest calls in flight, except that a rollout's later calls
    go where its first went while that server is available (its growing prompt hits its prefix cache)."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        if len(set(urls)) != len(urls):
            raise ValueError(f"an inference server is listed twice: {list(urls)}")
        self.servers = [InferenceServer(url) for url in urls]
        # A server that was down may come back with other weights (a restart loads the base model);
        # it rejoins only if its weight checksums equal these (set by each verified reload), and if it
        # serves the policy's LoRA adapter from this folder when the policy is one.
        self.reference_checksums: dict[str, str] | None = None
        self.reference_adapter: str | None = None
        self._reprobe: asyncio.Future | None = None
        self._rollouts: OrderedDict[str, InferenceServer] = OrderedDict()  # rollout id → its server

    def pick(self, rollout_id: str | None, *, exclude: tuple[InferenceServer, ...] = ()) -> InferenceServer:
        """The rollout's server while it is available (losing one moves only its rollouts), else the server
        with the fewest calls in flight (then the fewest routed), which becomes the rollout's."""
        candidates = [s for s in self.servers if s.available and s not in exclude]
        if not candidates:
            states = ", ".join(s.state() for s in self.servers if not s.available)
            raise NoServerAvailable(f"no inference server available: {states or 'none configured'}")
        server = self._rollouts.get(rollout_id) if rollout_id is not None else None
        if server is None or server not in candidates:
            server = min(candidates, key=lambda s: (s.in_flight, s.routed))
        if rollout_id is not None:
            self._rollouts[rollout_id] = server
            self._rollouts.move_to_end(rollout_id)
            if len(self._rollouts) > ROLLOUTS_REMEMBERED:
                self._rollouts.popitem(last=False)
        server.routed += 1
        return server

    def take_out(self, server: InferenceServer, reason: str) -> None:
        server.out_reason = reason
        log.error("inference server %s taken out: %s", server.url, reason)

    def find(self, url: str) -> InferenceServer | None:
        return next((server for server in self.servers if server.url == url), None)

    def add(self, url: str) -> InferenceServer:
        """A server registered at runtime (registration.py checks its weights first)."""
        if self.find(url) is not None:
            raise ValueError(f"the inference server {url} is already in the pool")
        server = InferenceServer(url)
        self.servers.append(server)
        return server

    def remove(self, server: InferenceServer) -> None:
        """Route no more calls to it; calls in flight on it finish (they hold the server, not the pool)."""
        self.servers.remove(server)

    @property
    def may_recover(self) -> bool:
        """Whether a server that is down now may come back without a reload (worth a call's wait)."""
        return any(server.may_return for server in self.servers)

    async def probe(self, client: UpstreamClient, timeout_s: float) -> None:
        """Probe every server's /health once; a server that comes back rejoins if its weights are current."""
        await asyncio.gather(*(self._probe(client, server, timeout_s) for server in self.servers))

    async def reprobe(self, client: UpstreamClient, timeout_s: float) -> None:
        """Probe the servers that are down now: one probe shared by every call waiting for them."""
        if self._reprobe is None or self._reprobe.done():
            down = [server for server in self.servers if server.may_return]
            self._reprobe = asyncio.gather(*(self._probe(client, server, timeout_s) for server in down))
        await asyncio.shield(self._reprobe)  # a waiting call that is cancelled leaves the probe to the others

    async def _probe(self, client: UpstreamClient, server: InferenceServer, timeout_s: float) -> None:
        was_healthy = server.healthy
        try:
            status, _ = await client.request("GET", f"{server.url}/health", timeout_s=timeout_s)
            failure = _health_failure(status)
            comes_back = failure is None and not was_healthy
            if comes_back and not await self._serves_policy(client, server.url, timeout_s):
                failure = "came back with other weights than the current policy's"
                self.take_out(server, failure)
        except UpstreamError as error:
            failure = str(error)
            # vLLM on a busy CPU can answer /health after the probe's timeout: a server that is serving leaves
            # only after slow answers in a row, as after failed connects (a reload in the meantime would
            # otherwise find no server to reload)
            if error.kind == "timeout" and was_healthy and not server.connect_failed(failure):
                return
        except (ValueError, KeyError) as error:
            failure = str(error)
        server.probed(failure)
        if server.healthy != was_healthy:
            if server.healthy:
                log.warning("inference server %s is healthy again", server.url)
            else:
                log.warning("inference server %s is unhealthy: %s", server.url, failure)

    async def _serves_policy(self, client: UpstreamClient, url: str, timeout_s: float) -> bool:
        """Whether a server that comes back holds the current policy (a restart loads the base model)."""
        expected = self.reference_checksums
        if expected is not None and await weight_checksums(client, url, timeout_s) != expected:
            return False
        adapter = self.reference_adapter
        return adapter is None or await served_adapter(client, url, timeout_s) == adapter


async def weight_checksums(client: UpstreamClient, url: str, timeout_s: float) -> dict[str, str]:
    """vLLM's sha256 of every weight tensor of every worker (`/weight_checker`, dev mode)."""
    status, body = await client.request(
        "POST", f"{url}/weight_checker", json={"action": "checksum"}, timeout_s=timeout_s
    )
    if status != 200:
        raise ValueError(f"/weight_checker answered HTTP {status}: {body[:300]!r}")
    return orjson.loads(body)["checksums"]


async def served_adapter(client: UpstreamClient, url: str, timeout_s: float) -> str | None:
    """The folder of the policy's LoRA adapter that the server lists in /v1/models (None: not loaded)."""
    status, body = await client.request("GET", f"{url}/v1/models", timeout_s=timeout_s)
    if status != 200:
        raise ValueError(f"/v1/models answered HTTP {status}: {body[:300]!r}")
    roots = {model.get("id"): model.get("root") for model in orjson.loads(body).get("data", [])}
    return roots.get(LORA_NAME)


def _health_failure(status: int) -> str | None:
    """Why a /health answer means the server cannot take calls, or None for 200."""
    if status == 200:
        return None
    if status == 404:
        # vLLM always serves /health at its root: a 404 means the URL is not a vLLM server's root.
        return "GET /health answered 404: is this the URL of a vLLM server (http://HOST:PORT)?"
    return f"GET /health answered HTTP {status}"
