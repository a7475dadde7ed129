"""Sustained OTLP/HTTP ingest into the durable store (spans/s, server CPU per 1,000 spans) vs protobuf decode,
and vs the same work in one process without HTTP.

Also times `SELECT request_model, count(*) FROM llm_calls GROUP BY 1` over 1M stored calls.
Run: .venv/bin/python bench/ingest.py [--seconds 20] [--clients 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import httpx
import psutil
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from rich.console import Console
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from otel_rl_server import ServerProcess  # noqa: E402 - the tests' real-server helper

from otel_rl.collector.flatten import traces_to_tables  # noqa: E402
from otel_rl.collector.ingest import traces_batch
from otel_rl.store import Store  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "captures" / "otel"
SPANS_PER_REQUEST = 512
TRACES_PER_REQUEST = 8
TARGET_SPANS_PER_CORE = 20_000
console = Console()


def fixture_spans() -> list:
    """(resource, scope, span) of every span in the protobuf trace fixtures: all GenAI dialects."""
    spans = []
    for path in sorted(FIXTURES.glob("*/*/*_traces.bin")):
        request = ExportTraceServiceRequest.FromString(path.read_bytes())
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                spans += [(rs.resource, ss.scope, span) for span in ss.spans]
    if not spans:
        sys.exit(f"no trace fixtures under {FIXTURES}: the bench replays them")
    return spans


def request_template(spans: list) -> tuple[bytes, list[bytes]]:
    """A 512-span request cycling through the fixture spans, and the placeholders it holds: its trace ids,
    then every span's start time and end time.

    Span ids are unique inside the request; each sent copy gets fresh trace ids and the time it is sent as
    its spans' start (a bytes.replace of the placeholders), as an exporter sends new spans: every request is
    new to the store's dedup, and the store sees time go on as it would.
    """
    placeholders = [os.urandom(16) for _ in range(TRACES_PER_REQUEST)] + [os.urandom(8), os.urandom(8)]
    start, end = (int.from_bytes(placeholder, "little") for placeholder in placeholders[-2:])
    request = ExportTraceServiceRequest()
    scopes: dict[int, object] = {}
    for i in range(SPANS_PER_REQUEST):
        resource, scope, template = spans[i % len(spans)]
        key = i % len(spans) // 8  # a handful of resource/scope groups, as a batching exporter sends
        if key not in scopes:
            rs = request.resource_spans.add()
            rs.resource.CopyFrom(resource)
            scopes[key] = rs.scope_spans.add(scope=scope)
        span = scopes[key].spans.add()
        span.CopyFrom(template)
        span.trace_id = placeholders[i % TRACES_PER_REQUEST]
        span.span_id = i.to_bytes(8, "big")
        span.start_time_unix_nano, span.end_time_unix_nano = start, end  # fixed64: 8 bytes, little-endian
        del span.links[:]
    return request.SerializeToString(), placeholders


def fresh_copy(template: bytes, placeholders: list[bytes]) -> bytes:
    *trace_ids, start, end = placeholders
    for placeholder in trace_ids:
        template = template.replace(placeholder, os.urandom(16))
    now = time.time_ns()
    template = template.replace(start, now.to_bytes(8, "little"))
    return template.replace(end, (now + 10_000_000).to_bytes(8, "little"))


def decode_rate(body: bytes, seconds: float = 2.0) -> tuple[float, float]:
    """CPU-time spans/s of protobuf parsing alone, and of parsing + flattening to Arrow, on one core."""
    rates = []
    for work in (
        lambda: ExportTraceServiceRequest.FromString(body),
        lambda: traces_to_tables(ExportTraceServiceRequest.FromString(body), datetime.now(UTC)),
    ):
        n, start = 0, time.process_time()
        while time.process_time() - start < seconds:
            work()
            n += 1
        rates.append(n * SPANS_PER_REQUEST / (time.process_time() - start))
    return rates[0], rates[1]


def store_rate(template: bytes, placeholders: list[bytes], workdir: Path, requests: int = 32) -> float:
    """CPU-time spans/s of the durable store write alone (anti-join insert + fsync'd commit, 4 per group)."""
    batches = [
        traces_to_tables(
            ExportTraceServiceRequest.FromString(fresh_copy(template, placeholders)), datetime.now(UTC)
        )
        for _ in range(requests)
    ]
    with Store(workdir / "store-only.duckdb", transforms_dir=workdir) as store:
        start = time.process_time()  # all threads of this process: DuckDB's too
        for group in range(0, requests, 4):
            for future in [store.submit(batch) for batch in batches[group : group + 4]]:
                future.result()
        return requests * SPANS_PER_REQUEST / (time.process_time() - start)


def pipeline_rate(
    template: bytes, placeholders: list[bytes], workdir: Path, producers: int, requests: int = 96
) -> float:
    """CPU-time spans/s of the server's work without HTTP: `producers` threads each take a fresh request,
    decode and flatten it (one at a time, as the server does), submit it and wait for the durable commit.

    Unlike the stages timed apart, every request is new (cold caches) and flattening runs beside the writer.
    """
    bodies = iter([fresh_copy(template, placeholders) for _ in range(requests)])
    take, decoding = threading.Lock(), threading.Lock()
    with Store(workdir / "pipeline.duckdb", transforms_dir=workdir) as store:

        def producer() -> None:
            while True:
                with take:
                    body = next(bodies, None)
                if body is None:
                    return
                with decoding:
                    batch = traces_batch(ExportTraceServiceRequest.FromString(body))
                store.submit(batch).result()

        threads = [threading.Thread(target=producer) for _ in range(producers)]
        start = time.process_time()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return requests * SPANS_PER_REQUEST / (time.process_time() - start)


def sustained_ingest(
    server: ServerProcess, template: bytes, placeholders: list[bytes], seconds: float, clients: int
):
    """Spans/s acknowledged by the server over `seconds` with `clients` concurrent exporters."""
    acked = [0] * clients
    stop = threading.Event()
    errors: list[str] = []

    def client(slot: int) -> None:
        headers = {"Content-Type": "application/x-protobuf", **server.auth}
        with httpx.Client(headers=headers, timeout=60) as http:
            while not stop.is_set():
                response = http.post(
                    f"{server.http_url}/v1/traces", content=fresh_copy(template, placeholders)
                )
                if response.status_code != 200:
                    errors.append(f"{response.status_code}: {response.text[:200]}")
                    continue
                acked[slot] += SPANS_PER_REQUEST

    server_process = psutil.Process(server.process.pid)
    threads = [threading.Thread(target=client, args=(slot,)) for slot in range(clients)]
    cpu_start = server_process.cpu_times()
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("ingesting over HTTP", total=seconds)
        while (elapsed := time.perf_counter() - start) < seconds:
            progress.update(task, completed=elapsed, description=f"ingesting: {sum(acked):,} spans acked")
            time.sleep(0.25)
    stop.set()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    cpu_end = server_process.cpu_times()
    cpu = (cpu_end.user + cpu_end.system) - (cpu_start.user + cpu_start.system)
    if errors:
        console.print(f"[yellow]{len(errors)} refused requests, e.g. {errors[0]}")
    return sum(acked), wall, cpu


def multiply_calls(db: Path, target_calls: int) -> int:
    """Copy the stored spans under new trace ids until llm_calls has at least `target_calls` rows."""
    con = duckdb.connect(str(db))
    try:
        calls = con.execute("SELECT count(*) FROM llm_calls").fetchone()[0]
    except duckdb.Error as exc:
        console.print(f"[yellow]no llm_calls view to time ({exc.__class__.__name__}: {str(exc)[:120]})")
        con.close()
        return 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("bulk-copying spans", total=target_calls)
        while 0 < calls < target_calls:
            factor = min(8, -(-target_calls // calls))
            con.execute(
                "INSERT INTO spans SELECT spans.* REPLACE (md5(trace_id || copy::VARCHAR) AS trace_id)"
                f" FROM spans, range(1, {factor}) AS copies(copy)"
            )
            con.execute("CHECKPOINT")
            calls = con.execute("SELECT count(*) FROM llm_calls").fetchone()[0]
            progress.update(task, completed=min(calls, target_calls))
    con.close()
    return calls


def time_group_by(db: Path) -> float:
    con = duckdb.connect(str(db), read_only=True)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        con.execute("SELECT request_model, count(*) FROM llm_calls GROUP BY 1").fetchall()
        best = min(best, time.perf_counter() - start)
    con.close()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the sustained-ingest run")
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP exporters")
    parser.add_argument("--calls", type=int, default=1_000_000, help="llm_calls rows for the GROUP BY timing")
    args = parser.parse_args()

    template, placeholders = request_template(fixture_spans())
    console.print(
        f"{SPANS_PER_REQUEST} GenAI fixture spans a request ({len(template) / 1024:.0f} KiB protobuf),"
        f" {args.clients} concurrent clients, {args.seconds:.0f} s, durable (fsync'd WAL before each 200)"
    )
    parse_rate, flatten_rate = decode_rate(fresh_copy(template, placeholders))

    with tempfile.TemporaryDirectory() as workdir:
        write_rate = store_rate(template, placeholders, Path(workdir))
        no_http_rate = pipeline_rate(template, placeholders, Path(workdir), args.clients)
        db = Path(workdir) / "bench.duckdb"
        server = ServerProcess(db, Path(workdir)).start()
        try:
            spans, wall, cpu = sustained_ingest(server, template, placeholders, args.seconds, args.clients)
        finally:
            server.stop()
        stored = duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM spans").fetchone()[0]
        per_1000 = 1000 * cpu / spans
        per_core = 1000 / per_1000
        console.print(f"\n[bold]ingest over HTTP[/]: {spans / wall:>10,.0f} spans/s wall")
        console.print(f"  acked / stored      : {spans:>10,} / {stored:,} spans")
        console.print(f"  server CPU          : {per_1000:>10.3f} CPU-s per 1,000 spans")
        console.print(f"  ingest              : {per_core:>10,.0f} spans/s per server core")
        console.print(f"  protobuf decode     : {parse_rate:>10,.0f} spans/s per core (the limit)")
        console.print(f"  decode + flatten    : {flatten_rate:>10,.0f} spans/s per core")
        console.print(
            f"  store write alone   : {write_rate:>10,.0f} spans/s per core (insert + durable commit)"
        )
        stages = 1 / (1 / flatten_rate + 1 / write_rate)
        console.print(f"  the stages, summed  : {stages:>10,.0f} spans/s per core (each timed apart, warm)")
        console.print(
            f"  the same, no HTTP   : {no_http_rate:>10,.0f} spans/s per core (fresh requests, "
            f"{args.clients} producers, flatten beside the writer: the floor under HTTP ingest)"
        )
        console.print(f"  ingest / decode     : {per_core / parse_rate:>10.1%} per core")
        console.print(f"  ingest / flatten    : {per_core / flatten_rate:>10.1%} per core")
        console.print(f"  ingest / no HTTP    : {per_core / no_http_rate:>10.1%} per core")
        verdict = "meets" if per_core >= TARGET_SPANS_PER_CORE else "MISSES"
        console.print(f"  target              : {verdict} {TARGET_SPANS_PER_CORE:,} spans/s on one core")

        calls = multiply_calls(db, args.calls) if args.calls else 0
        if calls:
            seconds = time_group_by(db)
            console.print(
                f"\n[bold]SELECT request_model, count(*) FROM llm_calls GROUP BY 1[/] over {calls:,} calls:"
                f" {seconds:.2f} s (best of 3)"
            )


if __name__ == "__main__":
    main()
