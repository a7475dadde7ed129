"""The vLLM servers behind the gateway: health, sticky routing of rollouts, taking a failed server out."""

import asyncio
import hashlib
import logging
from dataclasses import dataclass

import orjson

from otel_rl.gateway.client import UpstreamClient, UpstreamError

log = logging.getLogger(__name__)

LORA_NAME = "otel-rl-policy"  # the name vLLM serves the policy's LoRA adapter under


class NoServerAvailable(RuntimeError):
    """No inference server can take a call (all unhealthy or taken out)."""


@dataclass(eq=False)
class InferenceServer:
    """One vLLM server and what the gateway knows of it."""

    url: str
    healthy: bool = True  # answered its last health probe (or call)
    out_reason: str | None = None  # taken out by a failed reload: serves stale weights until the next one
    in_flight: int = 0

    @property
    def available(self) -> bool:
        return self.healthy and self.out_reason is None


class ServerPool:
    """Picks a server per call. A rollout always goes to the same server while it is available."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        if len(set(urls)) != len(urls):
            raise ValueError(f"an inference server is listed twice: {list(urls)}")
        self.servers = [InferenceServer(url.rstrip("/")) for url in urls]
        # A server that was down may come back with other weights (a restart loads the base model);
        # it rejoins only if its weight checksums equal these (set by each verified reload), and if it
        # serves the policy's LoRA adapter from this folder when the policy is one.
        self.reference_checksums: dict[str, str] | None = None
        self.reference_adapter: str | None = None

    def pick(self, rollout_id: str | None, *, exclude: tuple[InferenceServer, ...] = ()) -> InferenceServer:
        """The rollout's server (rendezvous hashing: losing one moves only its rollouts), else the idlest."""
        candidates = [s for s in self.servers if s.available and s not in exclude]
        if not candidates:
            states = ", ".join(
                f"{s.url} ({s.out_reason or 'unhealthy'})" for s in self.servers if not s.available
            )
            raise NoServerAvailable(f"no inference server available: {states or 'none configured'}")
        if rollout_id is None:
            return min(candidates, key=lambda s: s.in_flight)
        return max(candidates, key=lambda s: _affinity(rollout_id, s.url))

    def take_out(self, server: InferenceServer, reason: str) -> None:
        server.out_reason = reason
        log.error("inference server %s taken out: %s", server.url, reason)

    async def probe(self, client: UpstreamClient, timeout_s: float) -> None:
        """Probe every server's /health once; a server that comes back rejoins if its weights are current."""
        await asyncio.gather(*(self._probe(client, server, timeout_s) for server in self.servers))

    async def _probe(self, client: UpstreamClient, server: InferenceServer, timeout_s: float) -> None:
        try:
            status, _ = await client.request("GET", f"{server.url}/health", timeout_s=timeout_s)
            ok = status == 200
            if ok and not server.healthy:
                ok = await self._serves_policy(client, server.url, timeout_s)
                if not ok:
                    self.take_out(server, "came back with other weights than the current policy's")
        except (UpstreamError, ValueError):
            ok = False
        if ok != server.healthy:
            log.warning("inference server %s is %s", server.url, "healthy again" if ok else "unhealthy")
        server.healthy = ok

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


def _affinity(rollout_id: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{rollout_id}|{url}".encode(), digest_size=8).digest(), "big")
