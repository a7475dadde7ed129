"""Serving with verl: the gateway fronts the vLLM replicas verl launched; their weights move under its lease.

verl owns the replicas, and its `CheckpointEngineManager` moves the weights into them; the gateway stays the
one place that switches policy versions. `update_weights` is the gateway's pause (calls held and drained) →
verl's update → the gateway's commit (every server's weights verified, version + 1, resume), or its abort
when verl's update fails. It runs where verl's replicas run (a GPU); the test drives it with stand-ins for
verl's objects and the fake vLLM for the replicas' HTTP side. Call it from a thread, not an event loop:
verl's `update_weights` then runs its own loop (`auto_await`).
"""

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import httpx

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 600.0  # the gateway's own default: the longest weight update it waits for
# A pause answers once calls in flight drained (30 s by default, then 10 s for aborted ones to return) and
# the old weights were read; a commit once every server's checksums were computed.
REQUEST_TIMEOUT_S = 600.0


class RolloutReplica(Protocol):
    """What is used of verl's `verl.workers.rollout.replica.RolloutReplica`."""

    @property
    def server_address(self) -> str:
        """`HOST:PORT` (`[V6]:PORT`) of the replica's OpenAI-compatible vLLM server."""
        ...


class CheckpointEngineManager(Protocol):
    """What is used of verl's `verl.checkpoint_engine.base.CheckpointEngineManager`."""

    def update_weights(self, global_steps: int | None = None) -> Any: ...


class ServingError(RuntimeError):
    """The gateway refused a step, or a weight update did not commit; the message says why."""


class GatewayServing:
    """The gateway's admin API for verl's replicas: registration and weight updates under a lease."""

    def __init__(self, url: str, token: str) -> None:
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=5),
        )

    def register(self, replicas: Sequence[RolloutReplica]) -> list[str]:
        """Route calls to the replicas' servers (each must hold the policy's weights); their URLs."""
        urls = [replica_url(replica) for replica in replicas]
        for url in urls:
            self._post("/v1/admin/servers", f"register {url}", {"url": url})
        return urls

    def deregister(self, replicas: Sequence[RolloutReplica]) -> None:
        for replica in replicas:
            url = replica_url(replica)
            self._check(self._http.delete("/v1/admin/servers", params={"url": url}), f"deregister {url}")

    def update_weights(
        self,
        manager: CheckpointEngineManager,
        *,
        global_steps: int,
        version: int | None = None,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> dict[str, Any]:
        """Pause → verl's weight update → commit (abort if verl's update raises); the commit's report.

        `version`: the policy version the update makes (default: the gateway's current one + 1).
        """
        lease = self.pause(version=version, lease_s=lease_s)["lease"]
        try:
            manager.update_weights(global_steps=global_steps)
        except BaseException:
            try:
                self.abort(lease)
            except (ServingError, httpx.HTTPError) as error:  # the lease then expires by itself
                log.error("could not abort the gateway's lease %s: %s", lease, error)
            raise
        return self.commit(lease)

    def pause(self, *, version: int | None = None, lease_s: float = DEFAULT_LEASE_S) -> dict[str, Any]:
        """Hold the gateway's calls and drain them; the lease (`lease`, `version`, `servers`, ...).

        For replicas verl puts to sleep while it trains (hybrid rollout), pause before the sleep and commit
        after the wake-up: a sleeping server cannot take calls.
        """
        body: dict[str, Any] = {"lease_s": lease_s}
        if version is not None:
            body["version"] = version
        return self._post("/v1/admin/policy/pause", "pause the gateway for a weight update", body)

    def commit(self, lease: str) -> dict[str, Any]:
        """The weights moved: the gateway verifies them, serves the next version and resumes; its report."""
        report = self._post("/v1/admin/policy/commit", "commit the weight update", {"lease": lease})
        for server in report["servers"]:
            if not server["ok"]:
                log.warning("inference server %s taken out: %s", server["url"], server["error"])
        return report

    def abort(self, lease: str) -> dict[str, Any]:
        """The weights did not move: the gateway resumes on the old version; its report."""
        return self._post("/v1/admin/policy/abort", "abort the weight update", {"lease": lease})

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, what: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._check(self._http.post(path, json=body), what)

    @staticmethod
    def _check(response: httpx.Response, what: str) -> dict[str, Any]:
        if response.status_code == 200:
            return response.json()
        try:
            answer = response.json()
            message = answer["error"]["message"]
        except (ValueError, KeyError, TypeError):
            answer, message = None, response.text[:500]
        if isinstance(answer, dict) and answer.get("servers") and response.status_code == 502:
            failed = "; ".join(f"{s['url']}: {s['error']}" for s in answer["servers"] if not s.get("ok"))
            message = f"every server failed: {failed}"
        raise ServingError(f"could not {what}: the gateway answered HTTP {response.status_code}: {message}")


def replica_url(replica: RolloutReplica) -> str:
    """The URL of a replica's vLLM server, from verl's `HOST:PORT`."""
    address = replica.server_address
    if not address:
        raise ServingError("a replica has no server address yet: register replicas after verl launched them")
    return f"http://{address}"
