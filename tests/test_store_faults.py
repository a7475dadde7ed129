"""A full disk under a real server: exports get 503 + Retry-After (gRPC UNAVAILABLE), never 500; the server
recovers by itself when space returns, and nothing acknowledged is lost."""

import errno
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import requests
from google.rpc import code_pb2, status_pb2
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from otel_rl_server import ServerProcess
from test_collector_grpc import TRACE_EXPORT

from otel_rl.collector.ingest import traces_batch
from otel_rl.store import store as store_module
from otel_rl.store.store import Store
from otel_rl.store.writer import StoreUnavailable

SPANS_PER_REQUEST = 20
PROTOBUF = {"Content-Type": "application/x-protobuf"}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 20 MiB tmpfs. Only root mounts one (`make test` runs as root in CI): as root a failed mount fails
    the test, and otherwise the skip says why in the warnings summary too, not only under `-rs`. (A user
    namespace's tmpfs is no way round: it is reachable only through /proc/PID/root, which the store resolves
    back to the host's folder.)"""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        reason = "the disk-full tests mount a 20 MiB tmpfs, which needs root: run them as root, as CI does"
        warnings.warn(reason, pytest.PytestWarning, stacklevel=1)
        pytest.skip(reason)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    assert mounted.returncode == 0, f"root could not mount a tmpfs: {mounted.stderr}"
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; removing it gives the space back."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\xff" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return ballast


def spans_request() -> tuple[bytes, str]:
    """One new trace of SPANS_PER_REQUEST spans (a few KB of attributes each, so the WAL grows quickly)."""
    trace_id = os.urandom(16)
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for i in range(SPANS_PER_REQUEST):
        span = spans.add(trace_id=trace_id, span_id=os.urandom(8), name=f"step {i}")
        span.start_time_unix_nano = time.time_ns()
        span.end_time_unix_nano = span.start_time_unix_nano + 1000
        span.attributes.add(key="payload").value.string_value = os.urandom(1024).hex()
    return request.SerializeToString(), trace_id.hex()


class Exports:
    """Exports over HTTP and gRPC, remembering every trace acknowledged and every refusal."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.acked: list[str] = []
        self.refusals: list[str] = []  # what each refusal looked like, when it was not a proper 503
        self.unavailable = 0
        self.http = httpx.Client(headers={**PROTOBUF, **server.auth}, timeout=30)
        self.channel = grpc.insecure_channel(server.grpc_target)
        self.grpc_export = self.channel.unary_unary(TRACE_EXPORT)

    def over_http(self) -> int:
        body, trace_id = spans_request()
        started = time.monotonic()
        response = self.http.post(f"{self.server.http_url}/v1/traces", content=body)
        if response.status_code == 200:
            self.acked.append(trace_id)
        elif response.status_code == 503:
            self.unavailable += 1
            status = status_pb2.Status.FromString(response.content)
            retry = RetryInfo()
            if not (
                response.headers.get("retry-after") == "1"
                and status.code == code_pb2.UNAVAILABLE
                and len(status.details) == 1
                and status.details[0].Unpack(retry)
                and retry.retry_delay.seconds == 1
                and "No space left on device" in status.message
                and time.monotonic() - started < 5
            ):
                self.refusals.append(f"HTTP 503 {dict(response.headers)} {status}")
        else:
            self.refusals.append(f"HTTP {response.status_code}: {response.text}")
        return response.status_code

    def over_grpc(self) -> grpc.StatusCode:
        body, trace_id = spans_request()
        try:
            self.grpc_export(body, metadata=[("authorization", f"Bearer {self.server.token}")], timeout=30)
        except grpc.RpcError as error:
            trailers = dict(error.trailing_metadata() or ())
            retry = RetryInfo.FromString(trailers.get("google.rpc.retryinfo-bin", b""))
            if error.code() != grpc.StatusCode.UNAVAILABLE or retry.retry_delay.seconds != 1:
                self.refusals.append(f"gRPC {error.code()} {error.details()} {trailers}")
            self.unavailable += 1
            return error.code()
        self.acked.append(trace_id)
        return grpc.StatusCode.OK

    def close(self) -> None:
        self.http.close()
        self.channel.close()


def wait_until(condition: Callable[[], bool], failure: str, timeout_s: float = 30) -> None:
    """Poll `condition` until it holds; fail saying `failure` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{failure} within {timeout_s} s"
        time.sleep(0.05)


class CountingSession(requests.Session):
    """The exporter's HTTP session, counting the requests it sends."""

    tries = 0

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        self.tries += 1
        return super().send(request, **kwargs)


def spans_in(store: Store) -> int:
    return store.query_arrow("SELECT count(*) AS n FROM spans").column("n")[0].as_py()


def stored_traces(server: ServerProcess) -> dict[str, int]:
    rows = server.sql("SELECT trace_id, count(*) AS n FROM spans GROUP BY 1").to_pylist()
    return {row["trace_id"]: row["n"] for row in rows}


def test_a_full_disk_gets_503_over_http_and_grpc_and_the_server_recovers_losing_nothing(
    small_disk: Path, tmp_path: Path
) -> None:
    server = ServerProcess(small_disk / "otel_rl.duckdb", tmp_path).start()
    exports = Exports(server)
    try:
        for _ in range(10):
            assert exports.over_http() == 200 and exports.over_grpc() == grpc.StatusCode.OK
        ballast = fill(small_disk)

        # While full: every export is acknowledged (it fit) or refused with a retryable status, quickly.
        started = time.monotonic()
        while time.monotonic() - started < 3:  # past the writer's 1 s refusal window, more than once
            exports.over_http()
            exports.over_grpc()
        assert exports.unavailable >= 10, server.log()
        assert exports.refusals == [], exports.refusals[:3]
        assert httpx.get(f"{server.http_url}/healthz", timeout=5).status_code == 200
        assert server.scalar("SELECT count(*) FROM spans") >= 20 * SPANS_PER_REQUEST  # reads keep working

        # A real exporter's export tried while the disk is full (refused, then retried honouring Retry-After;
        # or it fits) is stored once space returns.
        session = CountingSession()
        exporter = OTLPSpanExporter(
            endpoint=f"{server.http_url}/v1/traces", headers=server.auth, timeout=30, session=session
        )
        span = TracerProvider().get_tracer("faults").start_span("exported while the disk is full")
        span.end()
        outcome: list[SpanExportResult] = []
        exporting = threading.Thread(target=lambda: outcome.append(exporter.export([span])))
        exporting.start()
        wait_until(lambda: session.tries > 0, "the exporter did not try")  # while the disk is full
        ballast.unlink()
        exporting.join(60)
        assert outcome == [SpanExportResult.SUCCESS], server.log()
        exports.acked.append(f"{span.get_span_context().trace_id:032x}")

        # Space is back: exports work again without a restart.
        for _ in range(10):
            assert exports.over_http() == 200 and exports.over_grpc() == grpc.StatusCode.OK
        assert exports.refusals == []
    finally:
        exports.close()
    server.stop()

    restarted = ServerProcess(small_disk / "otel_rl.duckdb", tmp_path).start()
    try:
        stored = stored_traces(restarted)
    finally:
        restarted.stop()
    assert [trace for trace in exports.acked if trace not in stored] == [], "acknowledged spans were lost"


def test_stopping_the_server_on_a_full_disk_exits_cleanly_and_keeps_every_acknowledged_span(
    small_disk: Path, tmp_path: Path
) -> None:
    server = ServerProcess(small_disk / "otel_rl.duckdb", tmp_path).start()
    exports = Exports(server)
    try:
        for _ in range(20):
            assert exports.over_http() == 200
        ballast = fill(small_disk)
        exports.over_http()
    finally:
        exports.close()
    server.stop()  # its checkpoint fails for lack of space: the WAL keeps the commits
    assert "the checkpoint at close failed" in server.log()

    ballast.unlink()
    restarted = ServerProcess(small_disk / "otel_rl.duckdb", tmp_path).start()
    try:
        stored = stored_traces(restarted)
    finally:
        restarted.stop()
    assert [trace for trace in exports.acked if trace not in stored] == []
    assert all(stored[trace] == SPANS_PER_REQUEST for trace in exports.acked)


def test_a_checkpoint_failing_on_a_full_disk_reopens_the_invalidated_store_and_loses_nothing(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # DuckDB invalidates the database when a checkpoint fails. A checkpoint comes after 256 MB of WAL,
    # more than this disk holds: at 1 MB, commits checkpoint as a large store's do.
    monkeypatch.setattr(store_module, "CHECKPOINT_THRESHOLD", "1MB")
    store = Store(small_disk / "otel_rl.duckdb")
    acked: list[str] = []

    def write() -> bool:
        body, trace_id = spans_request()
        request = ExportTraceServiceRequest.FromString(body)
        try:
            store.submit(traces_batch(request, "admin")).result()
        except StoreUnavailable:
            return False
        acked.append(trace_id)
        return True

    try:
        assert all(write() for _ in range(10))
        ballast = fill(small_disk)
        os.truncate(ballast, ballast.stat().st_size - 2 * 1024 * 1024)  # room for WAL, not for checkpoints
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and store.write_failure is None:
            write()
        assert "a commit is durable but the checkpoint after it failed" in caplog.text
        assert store.write_failure is not None  # the WAL filled the rest: writes are refused now

        ballast.unlink()
        wait_until(write, "writes were still refused")  # after the refusal window that follows a failure
        assert all(write() for _ in range(9))
        assert store.write_failure is None
        # Reopened once there was room for it: at once, or (its WAL replay writes too) when space returned.
        assert "the store was reopened after DuckDB invalidated it" in caplog.text
        assert store.query_arrow("SELECT count(*) AS n FROM spans").column("n")[0].as_py() > 0
    finally:
        store.close()
    with Store(small_disk / "otel_rl.duckdb") as reopened:
        stored = set(reopened.query_arrow("SELECT DISTINCT trace_id FROM spans").column(0).to_pylist())
    assert [trace for trace in acked if trace not in stored] == []


def test_gateway_spans_that_meet_a_full_disk_are_held_and_stored_once_space_returns(small_disk: Path) -> None:
    """The callers already have their answers: their spans wait in the gateway's writer, not on the floor."""
    from opentelemetry.sdk.resources import Resource
    from test_gateway_spans import records

    from otel_rl.gateway.span_rows import CallSpanWriter

    store = Store(small_disk / "otel_rl.duckdb")
    writer = CallSpanWriter(store.submit, Resource.create({}), flush_ms=50)
    try:
        ballast = fill(small_disk)
        for record in records():
            writer.write(record)
        wait_until(lambda: store.write_failure is not None, "the writer's flush never met the full disk")
        ballast.unlink()
        wait_until(lambda: spans_in(store) == len(records()), "the held spans were not stored")
    finally:
        writer.close()
    try:
        stored = spans_in(store)
        tokens = store.query_arrow("SELECT count(*) AS n FROM call_tokens").column("n")[0].as_py()
    finally:
        store.close()
    assert (stored, tokens) == (len(records()), 1)
