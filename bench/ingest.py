"""Sustained OTLP/HTTP ingest into the durable store (spans/s, server CPU per 1,000 spans) vs protobuf decode,
and vs the same work in one process without HTTP.

Also: sustained ingest with the normalizer keeping the default views' tables (transforms/) against ingest
into a store without normalized views (a transforms folder with no file: nothing for the normalizer to
compute), alternating in the same run, the aim being >= 90% of that rate; the normalizer's lag when ingest
stops and how long it takes to catch up. `otel-rl serve` has no option for its transforms folder, so this
comparison runs the server's work in-process (as `pipeline_rate` does); the HTTP run has the default views.
Queries over 1M and 10M stored calls: bench/query.py.

Run: .venv/bin/python bench/ingest.py [--seconds 20] [--clients 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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
from otel_rl.store.normalizer import NotNormalized  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "captures" / "otel"
SPANS_PER_REQUEST = 512
TRACES_PER_REQUEST = 8
TARGET_SPANS_PER_CORE = 20_000
AIM_WITH_VIEWS = 0.9  # of the rate without normalized views, in the same run
console = Console(width=None if sys.stdout.isatty() else 150)


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
        lambda: traces_to_tables(ExportTraceServiceRequest.FromString(body), datetime.now(UTC), "admin"),
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
            ExportTraceServiceRequest.FromString(fresh_copy(template, placeholders)),
            datetime.now(UTC),
            "admin",
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
                    batch = traces_batch(ExportTraceServiceRequest.FromString(body), "admin")
                store.submit(batch).result()

        threads = [threading.Thread(target=producer) for _ in range(producers)]
        start = time.process_time()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return requests * SPANS_PER_REQUEST / (time.process_time() - start)


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def normalizer_cpu(pid: int) -> float:
    """CPU seconds of the process's threads that run below normal priority: the store's normalizer (its
    thread lowers its own priority; nothing else in the server does)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        if int(fields[16]) > 0:  # nice (the 19th field; fields[0] is the 3rd)
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


def run_for(seconds: float, label: str, acked: list[int]) -> float:
    """Show the spans acknowledged so far for `seconds`; the wall seconds it ran."""
    start = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(label, total=seconds)
        while (elapsed := time.perf_counter() - start) < seconds:
            progress.update(task, completed=elapsed, description=f"{label}: {sum(acked):,} spans acked")
            time.sleep(0.25)
    return time.perf_counter() - start


def caught_up(lag: Callable[[], int], label: str) -> float:
    """Seconds until `lag()` (commits not normalized yet) is 0, shown as it goes."""
    start = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(label, total=None)
        while (behind := lag()) > 0:
            progress.update(task, description=f"{label}: {behind:,} commits behind")
            time.sleep(0.1)
    return time.perf_counter() - start


@dataclass
class Sustained:
    """A sustained ingest run: spans acknowledged, wall and CPU seconds (the normalizer's apart), and the
    normalizer's lag when ingest stopped (commits) and the seconds it took to catch up."""

    spans: int
    wall: float
    cpu: float
    normalizer_cpu: float
    lag: int
    catch_up: float
    load: str = ""

    @property
    def rate(self) -> float:
        return self.spans / self.wall


def sustained_ingest(
    server: ServerProcess, template: bytes, placeholders: list[bytes], seconds: float, clients: int
) -> Sustained:
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
    cpu_start, normalizing = server_process.cpu_times(), normalizer_cpu(server.process.pid)
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    run_for(seconds, "ingesting over HTTP", acked)
    stop.set()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    cpu_end, normalizing = server_process.cpu_times(), normalizer_cpu(server.process.pid) - normalizing
    cpu = (cpu_end.user + cpu_end.system) - (cpu_start.user + cpu_start.system)
    if errors:
        console.print(f"[yellow]{len(errors)} refused requests, e.g. {errors[0]}")

    def lag() -> int:
        health = httpx.get(f"{server.http_url}/healthz", headers=server.auth, timeout=10)  # details: admin
        return health.json()["normalized"]["lag"]

    behind = lag()
    return Sustained(sum(acked), wall, cpu, normalizing, behind, caught_up(lag, "normalizing"), load())


def sustained_pipeline(
    template: bytes,
    placeholders: list[bytes],
    db: Path,
    transforms_dir: Path | None,
    seconds: float,
    producers: int,
) -> Sustained:
    """The server's work without HTTP, sustained: `producers` threads each make a fresh request, decode and
    flatten it (one at a time, as the server does), store it and wait for the durable commit, for `seconds`;
    into a store with the views of `transforms_dir` (None: the default transforms)."""
    acked = [0] * producers
    stop = threading.Event()
    decoding = threading.Lock()
    with Store(db, transforms_dir=transforms_dir) as store:

        def producer(slot: int) -> None:
            while not stop.is_set():
                body = fresh_copy(template, placeholders)  # the client's work, 7% of a span's CPU here
                with decoding:
                    batch = traces_batch(ExportTraceServiceRequest.FromString(body), "admin")
                store.write(batch, "spans")
                acked[slot] += SPANS_PER_REQUEST

        threads = [threading.Thread(target=producer, args=(slot,)) for slot in range(producers)]
        cpu, normalizing = time.process_time(), normalizer_cpu(os.getpid())
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        run_for(seconds, "ingesting in-process", acked)
        stop.set()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        cpu, normalizing = time.process_time() - cpu, normalizer_cpu(os.getpid()) - normalizing
        behind = store.normalizer.lag
        catch_up = caught_up(lambda: store.normalizer.lag, "normalizing")
        try:
            store.wait_normalized(timeout_s=0)
        except NotNormalized as exc:  # a failing round: the lag said 0 without the rows being there
            console.print(f"[red]{exc}")
    return Sustained(sum(acked), wall, cpu, normalizing, behind, catch_up, load())


def with_and_without_views(
    template: bytes, placeholders: list[bytes], workdir: Path, seconds: float, producers: int, rounds: int
) -> tuple[list[Sustained], list[Sustained]]:
    """Alternating runs (without views first) of sustained in-process ingest, `rounds` of each."""
    no_views = workdir / "no-views"  # a transforms folder with no SQL file
    no_views.mkdir(exist_ok=True)
    views: list[Sustained] = []
    baseline: list[Sustained] = []
    for n in range(rounds):
        baseline.append(
            sustained_pipeline(
                template, placeholders, workdir / f"no-views-{n}.duckdb", no_views, seconds, producers
            )
        )
        views.append(
            sustained_pipeline(
                template, placeholders, workdir / f"views-{n}.duckdb", None, seconds, producers
            )
        )
    return views, baseline


def print_run(label: str, run: Sustained) -> None:
    console.print(
        f"  {label:<24}: {run.rate:>8,.0f} spans/s wall, {1e6 * run.cpu / run.spans:>5.0f} µs CPU a span"
        f" ({1e6 * run.normalizer_cpu / run.spans:.0f} of it the normalizer's); when ingest stopped the"
        f" normalizer was {run.lag:,} commits behind, caught up in {run.catch_up:.1f} s ({run.load})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each sustained-ingest run")
    parser.add_argument(
        "--clients", type=int, default=4, help="concurrent HTTP exporters (in-process: producers)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="in-process runs with and without views, alternating"
    )
    args = parser.parse_args()

    template, placeholders = request_template(fixture_spans())
    console.print(
        f"{SPANS_PER_REQUEST} GenAI fixture spans a request ({len(template) / 1024:.0f} KiB protobuf),"
        f" {args.clients} concurrent clients, {args.seconds:.0f} s, durable (fsync'd WAL before each 200);"
        f" {os.cpu_count()} cores, {load()}"
    )
    parse_rate, flatten_rate = decode_rate(fresh_copy(template, placeholders))

    with tempfile.TemporaryDirectory() as workdir:
        write_rate = store_rate(template, placeholders, Path(workdir))
        no_http_rate = pipeline_rate(template, placeholders, Path(workdir), args.clients)
        db = Path(workdir) / "bench.duckdb"
        server = ServerProcess(db, Path(workdir)).start()
        try:
            http = sustained_ingest(server, template, placeholders, args.seconds, args.clients)
        finally:
            server.stop()
        stored = duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM spans").fetchone()[0]
        views, baseline = with_and_without_views(
            template, placeholders, Path(workdir), args.seconds, args.clients, args.rounds
        )
    per_1000 = 1000 * http.cpu / http.spans
    per_core = 1000 / per_1000
    console.print(
        f"\n[bold]ingest over HTTP[/] (default views): {http.rate:>10,.0f} spans/s wall ({http.load})"
    )
    console.print(f"  acked / stored      : {http.spans:>10,} / {stored:,} spans")
    console.print(
        f"  server CPU          : {per_1000:>10.3f} CPU-s per 1,000 spans"
        f" ({1000 * http.normalizer_cpu / http.spans:.3f} of it the normalizer's, at low priority)"
    )
    console.print(f"  ingest              : {per_core:>10,.0f} spans/s per server core")
    console.print(
        f"  normalizer          : {http.lag:>10,} commits behind when ingest stopped, caught up in"
        f" {http.catch_up:.1f} s"
    )
    console.print(f"  protobuf decode     : {parse_rate:>10,.0f} spans/s per core (the limit)")
    console.print(f"  decode + flatten    : {flatten_rate:>10,.0f} spans/s per core")
    console.print(f"  store write alone   : {write_rate:>10,.0f} spans/s per core (insert + durable commit)")
    stages = 1 / (1 / flatten_rate + 1 / write_rate)
    console.print(f"  the stages, summed  : {stages:>10,.0f} spans/s per core (each timed apart, warm)")
    console.print(
        f"  the same, no HTTP   : {no_http_rate:>10,.0f} spans/s per core (fresh requests, "
        f"{args.clients} producers, flatten beside the writer, no views: the floor under HTTP ingest)"
    )
    console.print(f"  ingest / decode     : {per_core / parse_rate:>10.1%} per core")
    console.print(f"  ingest / flatten    : {per_core / flatten_rate:>10.1%} per core")
    console.print(f"  ingest / no HTTP    : {per_core / no_http_rate:>10.1%} per core")
    verdict = "meets" if per_core >= TARGET_SPANS_PER_CORE else "MISSES"
    console.print(f"  target              : {verdict} {TARGET_SPANS_PER_CORE:,} spans/s on one core")

    console.print(
        f"\n[bold]sustained ingest with the normalized views vs without[/] (in-process, {args.clients}"
        f" producers, {args.seconds:.0f} s each, alternating: `otel-rl serve` cannot run without them)"
    )
    for n, (without, with_views) in enumerate(zip(baseline, views, strict=True)):
        print_run(f"round {n + 1}, no views (floor)", without)
        print_run(f"round {n + 1}, default views", with_views)
    rate = sum(run.spans for run in views) / sum(run.wall for run in views)
    floor = sum(run.spans for run in baseline) / sum(run.wall for run in baseline)
    verdict = "met" if rate >= AIM_WITH_VIEWS * floor else "MISSED"
    console.print(
        f"  with views / without: {rate:,.0f} / {floor:,.0f} spans/s = {rate / floor:.1%}"
        f" (aim >= {AIM_WITH_VIEWS:.0%}: {verdict})"
    )


if __name__ == "__main__":
    main()
