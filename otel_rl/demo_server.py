"""The demos' `otel-rl serve`: started as a user starts it (its own process, the token in its environment),
waited for until healthy, stopped with SIGTERM."""

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console


@contextmanager
def running_server(
    workdir: Path, model: Path, vllm_url: str | None, token: str, console: Console, colocated: bool = False
):
    """`otel-rl serve` with its gateway over `vllm_url`, or over a local vLLM server it starts for `model`
    (`colocated`: `serve --colocated`, the servers sleep during each update); yields its URL."""
    from otel_rl.gateway.vllm import free_ports

    port, grpc_port = free_ports(2)
    upstream = ["--vllm", vllm_url] if vllm_url else ["--model", str(model)]
    command = [
        str(Path(sys.executable).parent / "otel-rl"), "serve", "--db", str(workdir / "otel_rl.duckdb"),
        *upstream, "--http-port", str(port), "--grpc-port", str(grpc_port),
        *(["--colocated"] if colocated else []),
    ]  # fmt: skip
    log_path = workdir / "server.log"
    # The token through the environment, not the command line, where every user of the machine reads it.
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env["OTEL_RL_TOKEN"] = token
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        with console.status("starting the otel-rl server and vLLM (about a minute)"):
            deadline = time.monotonic() + 600
            while not _healthy(url):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"otel-rl serve did not start; see {log_path}:\n{_tail(log_path)}")
                time.sleep(1)
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
