"""What the translated APIs add: `/v1/responses` and `/v1/messages` against `/v1/chat/completions`, same run.

Each endpoint is called through a real `otel-rl serve` process in front of bench/gateway.py's fast
vLLM-style server (the same ~11 KB chat response with token ids and logprobs for every call), by a load
generator in its own process, in interleaved rounds (the machine's load drifts): p50 latency at one client
and the gateway's CPU per call at 32 clients, medians of the rounds. Aim: p50 within 0.3 ms of Chat
Completions. The floor beneath, in this process and in CPU time: the protocol's translation functions alone
(request in, response out, serialized), and orjson alone (parse and serialize the chat response).

    .venv/bin/python bench/gateway_protocols.py [--seconds 1] [--rounds 5]
"""

import argparse
import multiprocessing
import statistics
import tempfile
import time
import timeit
from pathlib import Path

import orjson
from gateway import (
    TOKEN,
    _client,
    canned_chat_response,
    cpu_seconds,
    run_fake,
    start_server,
    stop,
    wait_until,
)
from rich.console import Console
from rich.table import Table

from otel_rl.gateway.protocols import protocols
from otel_rl.gateway.vllm import free_ports

console = Console(width=150)
PROMPT = "What is 17 * 23? Think step by step."
BODIES = {
    "/v1/chat/completions": {
        "model": "fake",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 100,
    },
    "/v1/responses": {"model": "fake", "input": PROMPT, "max_output_tokens": 100, "store": False},
    "/v1/messages": {"model": "fake", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 100},
}
AIM_MS = 0.3


def run_load(port: int, path: str, clients: int, seconds: float, out: multiprocessing.Queue) -> None:
    """Closed-loop load on `path` from `clients` keep-alive connections; puts the latencies on `out`."""
    import asyncio

    body = orjson.dumps(BODIES[path])
    request = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {TOKEN}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies: list[float] = []

    async def main() -> None:
        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(_client(port, request, deadline, latencies) for _ in range(clients)))

    asyncio.run(main())
    out.put(latencies)


def measure(port: int, path: str, clients: int, seconds: float) -> list[float]:
    out: multiprocessing.Queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=run_load, args=(port, path, clients, seconds, out))
    process.start()
    latencies = out.get(timeout=seconds + 60)
    process.join()
    return sorted(latencies)


def floor_us(path: str) -> tuple[float, float]:
    """CPU µs per call of the protocol's own work (its request translated, its response built from the
    parsed chat response and serialized), and of orjson alone on the chat response (parse, serialize)."""
    chat_bytes = canned_chat_response()
    chat = orjson.loads(chat_bytes)
    body = BODIES[path]
    module = protocols()[path][0] if path in protocols() else None

    def translate() -> None:
        if module is not None:
            module.chat_request(body)
            orjson.dumps(module.response_body(chat, body))

    def parse_and_dump() -> None:
        orjson.dumps(orjson.loads(chat_bytes))

    n = 2000
    best = {
        f: min(timeit.repeat(f, number=n, repeat=5, timer=time.process_time)) / n * 1e6
        for f in (translate, parse_and_dump)
    }
    return best[translate], best[parse_and_dump]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each load run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    args = parser.parse_args()
    paths = ["/v1/chat/completions"] + [p for p in ("/v1/responses", "/v1/messages") if p in protocols()]

    fake_port = free_ports(1)[0]
    fake = multiprocessing.Process(target=run_fake, args=(fake_port,), daemon=True)
    fake.start()
    wait_until(f"http://127.0.0.1:{fake_port}/health")
    p50s: dict[str, list[float]] = {path: [] for path in paths}
    cpu: dict[str, list[float]] = {path: [] for path in paths}
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-") as tmp:
        server, port = start_server(Path(tmp), [f"http://127.0.0.1:{fake_port}"])
        try:
            for path in paths:
                measure(port, path, 4, 0.5)  # warm-up: connections, code paths
            for _ in range(args.rounds):
                for path in paths:
                    latencies = measure(port, path, 1, args.seconds)
                    p50s[path].append(latencies[len(latencies) // 2] * 1000)
                    before = cpu_seconds(server.pid)
                    calls = len(measure(port, path, 32, args.seconds))
                    time.sleep(0.3)  # the span writer's last batch
                    cpu[path].append((cpu_seconds(server.pid) - before) / calls)
        finally:
            stop(server)
    fake.terminate()

    table = Table(title=f"Translated APIs vs Chat Completions, one `otel-rl serve`; {args.rounds} rounds")
    columns = ("endpoint", "p50 ms, 1 client", "vs chat", "CPU/call, 32 clients", "translation", "orjson")
    for column in columns:
        table.add_column(column, justify="right")
    chat_p50 = statistics.median(p50s[paths[0]])
    for path in paths:
        p50 = statistics.median(p50s[path])
        translation, plain = floor_us(path)
        added = p50 - chat_p50
        verdict = "" if path == paths[0] else f"{added:+.3f} ms (aim ≤ +{AIM_MS} ms)"
        floor = f"{translation:.1f} µs" if path != paths[0] else ""
        row = (
            f"{p50:.3f}",
            verdict,
            f"{statistics.median(cpu[path]) * 1e6:,.0f} µs",
            floor,
            f"{plain:.1f} µs",
        )
        table.add_row(path, *row)
    console.print(table)
    console.print("p50 per round (ms): " + "; ".join(f"{p} {[round(v, 3) for v in p50s[p]]}" for p in paths))
    console.print(
        "CPU per call per round (µs): " + "; ".join(f"{p} {[round(v * 1e6) for v in cpu[p]]}" for p in paths)
    )


if __name__ == "__main__":
    main()
