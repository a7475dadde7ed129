"""The otel-rl server as the online loop uses it: SQL queries, rollout keys, policy reloads."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from otel_rl import attributes as attr
from otel_rl.store.sandbox import Params
from otel_rl.train.config import ConfigError, TrainConfig


class OnlineTrainingError(RuntimeError):
    """The online loop cannot go on; the message says what to check."""


class ServerClient:
    """The otel-rl server as the online loop uses it: SQL queries, rollout keys, policy reloads."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._http = httpx.Client(
            base_url=self.url,
            headers={"authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(600, connect=5),
        )

    def query(
        self, sql: str, params: Params | None = None, *, after_commit: int | None = None
    ) -> pl.DataFrame:
        """One read-only statement over the store (its parameters bound by DuckDB), on this client's
        kept-alive connection (a new client per query spent a quarter of a step's reads setting up TLS
        contexts). `after_commit`: a read of the normalized tables waits for that commit only (not for the
        later ones). A `reads.Run` (otel_rl/store/reads.py)."""
        from otel_rl.query import query_result

        body: dict[str, Any] = {"sql": sql}
        if params is not None:
            body["params"] = params
        if after_commit is not None:
            body["after_commit"] = after_commit
        response = self._request("POST", "/v1/query", json=body)
        return pl.from_arrow(query_result(response, self.url))

    def issue_rollout_key(self, identity: Mapping[str, str]) -> str:
        """A key that acts for one rollout only: its OTLP exports and its model calls (with this identity)."""
        body = {
            "attempt_id": identity[attr.ATTEMPT_ID],
            "group_id": identity[attr.GROUP_ID],
            "task_id": identity[attr.TASK_ID],
            "split": identity[attr.SPLIT],
        }
        response = self._request("POST", f"/v1/admin/rollouts/{identity[attr.ROLLOUT_ID]}/key", json=body)
        _raise_for_status(response, "issue a rollout key")
        return response.json()["key"]

    def revoke_rollout_key(self, identity: Mapping[str, str]) -> None:
        """Revoke the key of the attempt `identity` names, which has ended: it is refused from now on."""
        response = self._request(
            "DELETE",
            f"/v1/admin/rollouts/{identity[attr.ROLLOUT_ID]}/key",
            params={"attempt_id": identity[attr.ATTEMPT_ID], "attempt_ended": "true"},
        )
        _raise_for_status(response, "revoke a rollout key")

    def post_reward(self, body: Mapping[str, Any]) -> None:
        """POST /v1/rewards (the admin token): a grader's reward, stored with the source the body names."""
        response = self._request("POST", "/v1/rewards", json=dict(body))
        _raise_for_status(response, f"post the reward of rollout {body.get('rollout_id')}")

    def policy(self) -> dict[str, Any]:
        """The gateway's current policy: `version`, `checkpoint`, servers, the last reload."""
        response = self._request("GET", "/v1/admin/policy")
        _raise_for_status(response, "read the gateway's policy")
        return response.json()

    def set_policy(self, checkpoint: Path, version: int) -> dict[str, Any]:
        """Pause the gateway, reload every inference server from `checkpoint`, resume at `version`.

        Returns the reload's report (phases in milliseconds: drain, reload, ..., total = time paused).
        """
        body = {"checkpoint": str(Path(checkpoint).resolve()), "version": version}
        response = self._request("POST", "/v1/admin/policy", json=body)
        _raise_for_status(response, f"reload the policy from {checkpoint}")
        return response.json()

    def sleep_servers(self) -> dict[str, Any]:
        """A colocated gateway: hold new calls, drain those in flight, put every server to sleep (its
        weights and KV cache leave the devices for the trainer's update); returns the drain and sleep times.
        """
        response = self._request("POST", "/v1/admin/policy/sleep")
        _raise_for_status(response, "put the inference servers to sleep for the update")
        return response.json()

    def wake_servers(self, checkpoint: Path, version: int) -> dict[str, Any]:
        """A colocated gateway: wake every server, reload `checkpoint` as `version`, resume the calls.

        Returns the reload's report, with `colocated_pause_ms`: how long calls were held since the sleep.
        """
        body = {"checkpoint": str(Path(checkpoint).resolve()), "version": version}
        response = self._request("POST", "/v1/admin/policy/wake", json=body)
        _raise_for_status(response, f"wake the inference servers with {checkpoint}")
        return response.json()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise OnlineTrainingError(
                f"cannot reach the otel-rl server at {self.url} ({error}): start `otel-rl serve --vllm URL` "
                "or set server.url"
            ) from None

    def close(self) -> None:
        self._http.close()


def _raise_for_status(response: httpx.Response, action: str) -> None:
    if response.status_code >= 400:
        raise OnlineTrainingError(f"could not {action}: HTTP {response.status_code} {response.text[:500]}")


def server_token(config: TrainConfig) -> str:
    """The admin token: the config's, else OTEL_RL_TOKEN or OTEL_RL_TOKEN_FILE, else the server's file."""
    from otel_rl.auth import TOKEN_FILE, client_token

    token = client_token(config.server.token)
    if token is None:
        raise ConfigError(
            "no server token: set server.token, OTEL_RL_TOKEN or OTEL_RL_TOKEN_FILE, "
            f"or run `otel-rl serve` here ({TOKEN_FILE})"
        )
    return token
