"""The `otel-rl serve` app (collector, store, gateway) run in-process by uvicorn on a free port, for tests.

In-process so that tests read the store directly and see the gateway's state; the HTTP path is the real one.
"""

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import uvicorn

from otel_rl.server import ServeSettings, create_app

ADMIN_TOKEN = "gateway-test-admin-token"


class GatewayServer:
    """`with GatewayServer(db, vllm=[url]) as server:` → .url (OpenAI base URL), .admin, .spans(where)."""

    def __init__(self, db: Path, *, vllm: list[str], **settings: Any) -> None:
        self.settings = ServeSettings(db=db, grpc_port=None, token=ADMIN_TOKEN, vllm=tuple(vllm), **settings)
        self.app = create_app(self.settings)
        self.store = self.app.state.store
        self.gateway = self.app.state.gateway
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL (`.../v1`)."""
        return f"{self.base_url}/v1"

    @property
    def admin(self) -> dict[str, str]:
        return {"authorization": f"Bearer {ADMIN_TOKEN}"}

    def __enter__(self) -> "GatewayServer":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=5)
        )
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the otel-rl app did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def rollout_key(self, rollout_id: str, **identity: str) -> str:
        response = httpx.post(
            f"{self.base_url}/v1/admin/rollouts/{rollout_id}/key",
            json=identity,
            headers=self.admin,
            timeout=10,
        )
        response.raise_for_status()
        return response.json()["key"]

    def spans(self, where: str, *, expect: int = 1, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Gateway spans matching `where` (SQL over spans), with attributes parsed and call_tokens joined;
        waits until at least `expect` are stored."""
        sql = f"""
            SELECT s.*, t.prompt_token_ids, t.choice_token_ids, t.choice_logprobs
            FROM spans s LEFT JOIN call_tokens t USING (trace_id, span_id)
            WHERE s.scope_name = 'otel_rl.gateway' AND ({where}) ORDER BY s.start_time_unix_nano"""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.store.query_arrow(sql).to_pylist()
            if len(rows) >= expect or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for row in rows:  # the span's attributes whole: schema.sql stores its content attributes apart
            row["attributes"] = json.loads(row["attributes"]) | json.loads(
                row.pop("content_attributes") or "{}"
            )
        return rows

    def query(self, sql: str) -> pa.Table:
        return self.store.query_arrow(sql)
