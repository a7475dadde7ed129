"""A real `otel-rl serve` subprocess on free loopback ports, for tests (see the otel_rl_server fixture)."""

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import polars as pl
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from otel_rl.gateway.vllm import free_ports

OTEL_RL = Path(sys.executable).parent / "otel-rl"
IN_FLIGHT = "otel_rl_http_requests_in_flight"


class ServerProcess:
    """`otel-rl serve --db DB` run in `workdir`: `.start()`, `.stop()` (SIGTERM) or `.kill()` (SIGKILL)."""

    def __init__(
        self,
        db: Path,
        workdir: Path,
        *,
        token: str = "test-admin-token",
        flags: tuple[str, ...] = (),
        max_open_files: int | None = None,
    ) -> None:
        self.db = db
        self.max_open_files = max_open_files  # the process's RLIMIT_NOFILE (soft and hard), else inherited
        self.flags = flags  # more `otel-rl serve` flags, e.g. ("--vllm", url) for the gateway
        self.workdir = workdir
        self.token = token
        self.http_port, self.grpc_port = free_ports(2)
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.log_path = workdir / f"server-{self.http_port}.log"
        self.process: subprocess.Popen | None = None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def start(self, timeout: float = 60) -> "ServerProcess":
        args = [str(OTEL_RL), "serve", "--db", str(self.db), "--token", self.token]
        args += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port), *self.flags]
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                args, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=self._limits
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"otel-rl serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.http_url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.kill()
        raise TimeoutError(f"otel-rl serve did not become healthy in {timeout}s:\n{self.log()}")

    def _limits(self) -> None:
        if self.max_open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_open_files, self.max_open_files))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then wait for the clean shutdown (uvicorn re-raises the signal once it is done)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        assert code in (0, -signal.SIGTERM), f"otel-rl serve exited with {code}:\n{self.log()}"

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def sql(self, sql: str, params: list | dict | None = None) -> pa.Table:
        """Run a read-only query through the server's /v1/query endpoint, its parameters bound by DuckDB."""
        body = {"sql": sql} if params is None else {"sql": sql, "params": params}
        response = httpx.post(f"{self.http_url}/v1/query", json=body, headers=self.auth, timeout=60)
        assert response.status_code == 200, response.text
        return pa.ipc.open_stream(response.content).read_all()

    def run(self, sql: str, params: list | dict | None = None) -> pl.DataFrame:
        """`sql` as a polars frame: a `reads.Run` (otel_rl/store/reads.py) through this server."""
        return pl.from_arrow(self.sql(sql, params))

    def scalar(self, sql: str) -> object:
        return self.sql(sql).column(0)[0].as_py()

    def counts(self) -> dict[str, int]:
        """Rows in each raw table."""
        tables = ("spans", "call_tokens", "logs", "metric_points")
        row = self.sql("SELECT " + ", ".join(f"(SELECT count(*) FROM {t}) AS {t}" for t in tables))
        return {t: row.column(t)[0].as_py() for t in tables}

    def wait_for_requests_in_flight(self, count: int, what: str, timeout_s: float = 30) -> None:
        """Until the server is answering exactly `count` HTTP requests besides the /metrics request that
        counts them (its otel_rl_http_requests_in_flight gauge); fails saying `what` was awaited."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = httpx.get(f"{self.http_url}/metrics", headers=self.auth, timeout=10).text
            [family] = (f for f in text_string_to_metric_families(text) if f.name == IN_FLIGHT)
            others = int(family.samples[0].value) - 1
            if others == count:
                return
            assert time.monotonic() < deadline, f"{what}: {others} requests in flight, not {count}"
            time.sleep(0.05)
