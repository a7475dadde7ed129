"""Gateway overhead: requests/s and added latency through `otel-rl serve` vs a fast vLLM-style server, direct.

Part 1 (throughput and latency): a minimal raw-asyncio HTTP/1.1 server answers every chat call with the same
~11 KB vLLM response (token ids and logprobs of 100 tokens). A load generator in its own process (raw asyncio,
keep-alive connections, closed loop) calls it directly, then through the gateway of a real `otel-rl serve`
process that records every call durably in its DuckDB store, at 1 and 32 clients. Aims: at 32 clients at least
25% of direct throughput; at 1 client at most 1 ms added p50. Beside them, the peer: a bare Python proxy on
the gateway's HTTP stack (uvicorn, uvloop, httptools, one aiohttp session) that relays the bytes and does
nothing else, the floor under any Python gateway.

Part 2 (reload): the real tiny vLLM server's bare reload (pause, reload_weights or load_lora_adapter,
reset_prefix_cache, resume) against `POST /v1/admin/policy` through the gateway, for a checkpoint and for a
LoRA adapter. Aim: at most 50 ms overhead.

    .venv/bin/python bench/gateway.py [--seconds 5] [--reloads 10] [--part all|proxy|reload]
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import uvicorn
from rich.console import Console
from rich.table import Table

from otel_rl.gateway.vllm import free_ports

console = Console()
TOKEN = "bench-admin-token"
N_TOKENS = 100
CHAT_BODY = json.dumps(
    {
        "model": "fake",
        "messages": [{"role": "user", "content": "What is 17 * 23? Think step by step."}],
        "max_tokens": 100,
    }
).encode()


# ------------------------------------------------------------------ the fast vLLM-style server


def canned_chat_response() -> bytes:
    """A vLLM chat response with prompt token ids, 100 sampled token ids and their logprobs (~11 KB)."""
    tokens = [(1000 + i, f"tok{i}", -0.5 - i / 1000) for i in range(N_TOKENS)]
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "".join(t for _, t, _ in tokens),
                    "tool_calls": [],
                },
                "logprobs": {
                    "content": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for _, t, lp in tokens
                    ]
                },
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": [i for i, _, _ in tokens],
            }
        ],
        "usage": {"prompt_tokens": 40, "total_tokens": 140, "completion_tokens": N_TOKENS},
        "prompt_token_ids": list(range(1, 41)),
    }
    return json.dumps(body, separators=(",", ":")).encode()


def http_response(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def serve_fake(port: int) -> None:
    reply = http_response(canned_chat_response())
    health = http_response(b"")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = _content_length(head)
                if length:
                    await reader.readexactly(length)
                writer.write(reply if head.startswith(b"POST") else health)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def run_fake(port: int) -> None:
    asyncio.run(serve_fake(port))


def _content_length(head: bytes) -> int:
    index = head.lower().find(b"content-length:")
    if index < 0:
        return 0
    return int(head[index + 15 : head.index(b"\r\n", index)])


# ------------------------------------------------------------------ the peer: a bare Python proxy


def bare_proxy_app(upstream: str):  # noqa: ANN201 - an ASGI callable
    """Relays each call to `upstream` with aiohttp and does nothing else (no parsing, no recording): what
    uvicorn and an HTTP client alone cost a Python proxy, the floor under the gateway's throughput."""
    session: aiohttp.ClientSession | None = None

    async def app(scope: dict, receive, send) -> None:  # noqa: ANN001
        nonlocal session
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        if session is None:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        headers = {"content-type": "application/json"}
        async with session.post(upstream + scope["path"], data=body, headers=headers) as response:
            content = await response.read()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    return app


def run_bare_proxy(port: int, upstream: str) -> None:
    # the gateway's HTTP stack: uvicorn with uvloop and httptools
    uvicorn.run(
        bare_proxy_app(upstream), host="127.0.0.1", port=port, log_level="warning", access_log=False,
        lifespan="off", loop="uvloop", http="httptools",
    )  # fmt: skip


# ------------------------------------------------------------------ the load generator


async def _client(port: int, request: bytes, deadline: float, latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"bench call failed: {head[:200]!r}")
            await reader.readexactly(_content_length(head))
            latencies.append(time.perf_counter() - start)
    finally:
        writer.close()


def run_load(
    port: int, headers: dict[str, str], clients: int, seconds: float, out: multiprocessing.Queue
) -> None:
    """Closed-loop load from `clients` keep-alive connections; puts (requests/s, latencies) on `out`."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{head}"
        f"content-length: {len(CHAT_BODY)}\r\n\r\n"
    ).encode() + CHAT_BODY
    latencies: list[float] = []

    async def main() -> float:
        start = time.perf_counter()
        deadline = start + seconds
        await asyncio.gather(*(_client(port, request, deadline, latencies) for _ in range(clients)))
        return time.perf_counter() - start

    elapsed = asyncio.run(main())
    out.put((len(latencies) / elapsed, latencies))


def measure(
    port: int, headers: dict[str, str], clients: int, seconds: float
) -> tuple[float, float, float, int]:
    """requests/s, p50 ms, p99 ms, calls made: the load generator runs in its own process."""
    out: multiprocessing.Queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=run_load, args=(port, headers, clients, seconds, out))
    process.start()
    rps, latencies = out.get(timeout=seconds + 60)
    process.join()
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    return rps, p50, p99, len(latencies)


# ------------------------------------------------------------------ processes


def wait_until(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout_s}s")


def start_server(workdir: Path, vllm_urls: list[str]) -> tuple[subprocess.Popen, int]:
    port, grpc_port = free_ports(2)
    args = [str(Path(sys.executable).parent / "otel-rl"), "serve", "--db", str(workdir / "bench.duckdb")]
    args += ["--token", TOKEN, "--http-port", str(port), "--grpc-port", str(grpc_port)]
    for url in vllm_urls:
        args += ["--vllm", url]
    log = (workdir / "serve.log").open("ab")
    process = subprocess.Popen(args, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    wait_until(f"http://127.0.0.1:{port}/healthz")
    return process, port


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(60)


def count_spans(port: int, expected: int, timeout_s: float = 30) -> int:
    """Gateway spans in the store, once there are `expected` (or after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/query",
            json={"sql": "SELECT count(*) AS n FROM spans WHERE scope_name = 'otel_rl.gateway'"},
            headers={"authorization": f"Bearer {TOKEN}", "accept": "application/json"},
            timeout=60,
        )
        response.raise_for_status()
        recorded = json.loads(response.content)[0]["n"]
        if recorded >= expected or time.monotonic() > deadline:
            return recorded
        time.sleep(0.2)


# ------------------------------------------------------------------ part 1


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (on a shared machine, CPU per call is steadier)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_proxy(seconds: float) -> bool:
    fake_port, peer_port = free_ports(2)
    fake = multiprocessing.Process(target=run_fake, args=(fake_port,), daemon=True)
    fake.start()
    wait_until(f"http://127.0.0.1:{fake_port}/health")
    peer = multiprocessing.Process(
        target=run_bare_proxy, args=(peer_port, f"http://127.0.0.1:{fake_port}"), daemon=True
    )
    peer.start()
    results = {}
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-") as tmp:
        server, port = start_server(Path(tmp), [f"http://127.0.0.1:{fake_port}"])
        try:
            auth = {"authorization": f"Bearer {TOKEN}"}
            measure(peer_port, {}, 4, 1.0)
            calls = measure(port, auth, 4, 1.0)[3]  # warm-up: connections, code paths
            for clients in (1, 32):
                results[("direct", clients)] = measure(fake_port, {}, clients, seconds) + (None,)
                for path, proxy_port, pid in (
                    ("bare proxy", peer_port, peer.pid),
                    ("gateway", port, server.pid),
                ):
                    cpu = cpu_seconds(pid)
                    run = measure(proxy_port, auth, clients, seconds)
                    time.sleep(0.3)  # the exporter's last batch
                    results[(path, clients)] = run + ((cpu_seconds(pid) - cpu) / run[3],)
                calls += results[("gateway", clients)][3]
            recorded = count_spans(port, calls)
        finally:
            stop(server)
    peer.terminate()
    fake.terminate()

    table = Table(
        title=f"Gateway vs direct: {seconds:g} s per run, {len(canned_chat_response()):,}-byte responses"
    )
    for column in ("clients", "path", "requests/s", "p50 ms", "p99 ms", "proxy CPU/call", "vs direct"):
        table.add_column(column, justify="right")
    ok = True
    for clients in (1, 32):
        d_rps, d_p50, d_p99, _, _ = results[("direct", clients)]
        g_rps, g_p50, g_p99, _, g_cpu = results[("gateway", clients)]
        p_rps, p_p50, p_p99, _, p_cpu = results[("bare proxy", clients)]
        table.add_row(str(clients), "direct", f"{d_rps:,.0f}", f"{d_p50:.3f}", f"{d_p99:.3f}", "", "")
        peer = f"+{p_p50 - d_p50:.3f} ms p50" if clients == 1 else f"{p_rps / d_rps:.1%} of req/s"
        row = (f"{p_rps:,.0f}", f"{p_p50:.3f}", f"{p_p99:.3f}", f"{p_cpu * 1e6:,.0f} µs", peer)
        table.add_row(str(clients), "bare proxy", *row)
        if clients == 1:
            added = g_p50 - d_p50
            verdict = f"+{added:.3f} ms p50 (aim ≤ 1 ms)"
            ok &= added <= 1.0
        else:
            ratio = g_rps / d_rps
            verdict = f"{ratio:.1%} of req/s (aim ≥ 25%)"
            ok &= ratio >= 0.25
        cpu = f"{g_cpu * 1e6:,.0f} µs"
        table.add_row(str(clients), "gateway", f"{g_rps:,.0f}", f"{g_p50:.3f}", f"{g_p99:.3f}", cpu, verdict)
    console.print(table)
    console.print(f"calls through the gateway: {calls:,}; gateway spans in the store: {recorded:,}")
    if recorded != calls:
        console.print("[red]not every call was recorded[/]")
        ok = False
    return ok


# ------------------------------------------------------------------ part 2

LORA_NAME = "otel-rl-policy"  # otel_rl.gateway.reload.LORA_NAME


def bare_load(kind: str, folder: Path) -> tuple[str, dict]:
    if kind == "checkpoint":
        return "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
    return "/v1/load_lora_adapter", {"lora_name": LORA_NAME, "lora_path": str(folder), "load_inplace": True}


def bare_reload(client: httpx.Client, url: str, kind: str, folder: Path) -> None:
    """vLLM's own reload protocol, called directly."""
    for path, body in [
        ("/pause?mode=wait", None),
        bare_load(kind, folder),
        ("/reset_prefix_cache", None),
        ("/resume", None),
    ]:
        client.post(url + path, json=body).raise_for_status()


def write_adapter(folder: Path, base: Path, seed: int, rank: int = 8) -> Path:
    """A random LoRA adapter for the tiny model in PEFT's files (as tests/test_gateway_lora.py writes)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    generator = torch.Generator().manual_seed(seed)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    tensors = {}
    for name, module in AutoModelForCausalLM.from_pretrained(base).named_modules():
        if name.rsplit(".", 1)[-1] in targets:
            out_features, in_features = module.weight.shape
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(
                rank, in_features, generator=generator
            )
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(
                out_features, rank, generator=generator
            )
    folder.mkdir(parents=True)
    save_file({k: v * 0.3 for k, v in tensors.items()}, folder / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 16,
        "target_modules": list(targets),
        "bias": "none",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def time_reloads(
    http: httpx.Client,
    vllm_url: str,
    policy_url: str,
    kind: str,
    folders: list[Path],
    rounds: int,
    version: int,
) -> tuple[list[float], list[float], list[dict], int]:
    """Reloads through the gateway and bare, interleaved (the machine's load drifts), alternating folders
    (every reload changes the weights); the first is a warm-up. Returns both paths' s, reports, version."""
    bare, through, reports = [], [], []
    for i in range(2 * rounds + 1):
        version += 1
        start = time.perf_counter()
        if i % 2 == 0:
            body = {kind: str(folders[0]), "version": version}
            response = http.post(policy_url, json=body, headers={"authorization": f"Bearer {TOKEN}"})
            response.raise_for_status()
            if i > 0:
                through.append(time.perf_counter() - start)
                reports.append(response.json())
        else:
            bare_reload(http, vllm_url, kind, folders[1])
            bare.append(time.perf_counter() - start)
    return bare, through, reports, version


def bench_reload(rounds: int) -> bool:
    from otel_rl.gateway.vllm import VLLMServer
    from otel_rl.tinymodel import init_model

    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-") as tmp:
        workdir = Path(tmp)
        folders = {
            "checkpoint": [init_model(workdir / "seed1", seed=1), init_model(workdir / "seed0", seed=0)],
        }
        folders["lora_adapter"] = [
            write_adapter(workdir / f"lora{i}", folders["checkpoint"][1], i) for i in (1, 2)
        ]
        console.print("starting vLLM on the tiny model (LoRA enabled)…")
        with (
            VLLMServer(folders["checkpoint"][1], served_model_name="tiny", lora_rank=8) as vllm,
            httpx.Client(timeout=120) as http,
        ):
            server, port = start_server(workdir, [vllm.url])
            policy_url = f"http://127.0.0.1:{port}/v1/admin/policy"
            results, version = {}, 0
            try:
                for kind in ("checkpoint", "lora_adapter"):
                    *results[kind], version = time_reloads(
                        http, vllm.url, policy_url, kind, folders[kind], rounds, version
                    )
            finally:
                stop(server)
    table = Table(title=f"Reload cycle on the tiny model (vLLM, one server), median of {rounds}")
    for column in ("path", "ms", "vs bare"):
        table.add_column(column, justify="right")
    ok = True
    phases = ("drain", "pause", "reload", "verify", "resume", "total")
    for kind, load in (("checkpoint", "reload_weights"), ("lora_adapter", "load_lora_adapter")):
        bare, through, reports = results[kind]
        bare_ms, through_ms = statistics.median(bare) * 1000, statistics.median(through) * 1000
        overhead = through_ms - bare_ms
        ok &= overhead <= 50
        table.add_row(f"bare vLLM: pause, {load}, reset_prefix_cache, resume", f"{bare_ms:.1f}", "")
        table.add_row(
            f"POST /v1/admin/policy {{{kind}}}", f"{through_ms:.1f}", f"{overhead:+.1f} ms (aim ≤ 50 ms)"
        )
        medians = {phase: statistics.median(report[f"{phase}_ms"] for report in reports) for phase in phases}
        results[kind] = medians
    console.print(table)
    for kind in ("checkpoint", "lora_adapter"):
        console.print(
            f"gateway phases, {kind} (median ms): "
            + ", ".join(f"{p} {v:.1f}" for p, v in results[kind].items())
        )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each load run")
    parser.add_argument("--reloads", type=int, default=10, help="reload cycles timed on each path")
    parser.add_argument(
        "--part", choices=["all", "proxy", "reload"], default="all", help="(reload starts vLLM)"
    )
    args = parser.parse_args()
    ok = True
    if args.part in ("all", "proxy"):
        ok &= bench_proxy(args.seconds)
    if args.part in ("all", "reload"):
        ok &= bench_reload(args.reloads)
    console.print("[green]all aims met[/]" if ok else "[yellow]some aims missed (see above)[/]")


if __name__ == "__main__":
    main()
