"""Availability under hostile clients: slow and piled-up connections, vanishing clients, SIGTERM under load.

Every attack is sent as a client would, on raw loopback sockets to a real `otel-rl serve` process; the counts
stay small by lowering the server's caps and its open-file limit instead of opening 21,000 sockets.
"""

import resource
import select
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pyarrow as pa
import pytest
from fake_vllm import MODEL, FakeVLLM, Fault
from otel_rl_server import ServerProcess
from test_collector_grpc import raw_trace_export
from test_collector_http import spans_request

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
PER_CLIENT = 40
HALF_REQUEST = b"POST /v1/traces HTTP/1.1\r\nHost: otel-rl\r\nX-Slow: "  # headers that never end
MARGIN_S = 3.0  # scheduling on a loaded test machine
QUERY_TIMEOUT_S = 2.0
SLOW_SQL = "SELECT sum(a.range * b.range) FROM range(1000000) a, range(1000000) b"  # hours of work
QUERY_MARGIN_S = 2.5  # the HTTP round trip and the JSON of a page, on a loaded machine


def guarded_server(tmp_path, *flags: str, max_open_files: int | None = None) -> ServerProcess:
    flags = ("--header-timeout", str(HEADER_TIMEOUT_S), "--body-timeout", str(BODY_TIMEOUT_S), *flags)
    server = ServerProcess(tmp_path / "store.duckdb", tmp_path, flags=flags, max_open_files=max_open_files)
    return server.start()


@contextmanager
def slow_clients(
    server: ServerProcess, count: int, source: str, first: bytes = HALF_REQUEST, *, port: int | None = None
) -> Iterator[list]:
    """`count` connections from the loopback address `source`, each having sent `first` and nothing more."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.create_connection(
                ("127.0.0.1", port or server.http_port), timeout=5, source_address=(source, 0)
            )
            sock.sendall(first)
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def answer(sock: socket.socket, timeout_s: float) -> bytes | None:
    """What the server sent before closing the connection; None when it is still open after `timeout_s`."""
    sock.settimeout(timeout_s)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return received


def answered_within(sockets: list[socket.socket], count: int, timeout_s: float) -> list[socket.socket]:
    """The sockets the server has answered (readable), once there are `count`, or all there are after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while len(answered := select.select(sockets, [], [], 0)[0]) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return answered


def status_of(reply: bytes | None) -> int | None:
    return int(reply.split(b" ", 2)[1]) if reply else None


def exports_work(server: ServerProcess) -> None:
    """Health, an OTLP/HTTP export and an OTLP/gRPC export, each answered promptly."""
    assert httpx.get(f"{server.http_url}/healthz", timeout=5).status_code == 200
    request, _ = spans_request(2)
    headers = server.auth | {"content-type": "application/x-protobuf"}
    exported = httpx.post(
        f"{server.http_url}/v1/traces", content=request.SerializeToString(), headers=headers
    )
    assert exported.status_code == 200, exported.text
    raw_trace_export(server, spans_request(2)[0].SerializeToString(), server.token)


@pytest.fixture(autouse=True)
def room_for_sockets() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))


def test_a_flood_of_slow_connections_from_one_address_leaves_health_and_exports_working(tmp_path):
    # 600 connections where the server may open 512 files: before the caps they took every descriptor
    server = guarded_server(tmp_path, "--max-connections-per-client", str(PER_CLIENT), max_open_files=512)
    try:
        with slow_clients(server, 600, "127.0.0.2") as flood:
            opened = time.monotonic()
            exports_work(server)
            replies = [answer(sock, HEADER_TIMEOUT_S + MARGIN_S) for sock in flood]
            closed = time.monotonic()
        statuses = [status_of(reply) for reply in replies]
        assert (statuses.count(503), statuses.count(408)) == (600 - PER_CLIENT, PER_CLIENT)
        assert b"--max-connections-per-client" in replies[-1] and b"retry-after: 1" in replies[-1]
        assert closed - opened < HEADER_TIMEOUT_S + MARGIN_S  # the held ones were cut at the deadline
        exports_work(server)
    finally:
        server.stop()
    assert "Traceback" not in server.log()


def test_connections_over_the_total_cap_are_refused_and_grpc_keeps_working(tmp_path):
    flags = ("--max-connections", "60", "--max-connections-per-client", str(PER_CLIENT))
    server = guarded_server(tmp_path, *flags)
    try:
        with (
            slow_clients(server, PER_CLIENT, "127.0.0.2") as first,
            slow_clients(server, PER_CLIENT, "127.0.0.3") as more,
        ):
            over_cap = 2 * PER_CLIENT - 60
            answered = answered_within(more, over_cap, MARGIN_S)
            assert len(answered) == over_cap  # the others are still open
            assert {status_of(answer(sock, 1)) for sock in answered} == {503}
            refused = httpx.get(f"{server.http_url}/healthz", timeout=5)
            assert refused.status_code == 503 and "--max-connections" in refused.text
            raw_trace_export(server, spans_request(2)[0].SerializeToString(), server.token)  # another port
            held = first + [sock for sock in more if sock not in answered]
            # the held ones time out, which frees their slots
            assert {status_of(answer(sock, HEADER_TIMEOUT_S + MARGIN_S)) for sock in held} == {408}
            exports_work(server)
    finally:
        server.stop()


def test_grpc_connections_that_never_open_a_session_are_closed_at_the_header_timeout(tmp_path):
    server = guarded_server(tmp_path)
    try:
        with slow_clients(server, 20, "127.0.0.2", b"", port=server.grpc_port) as idle:
            exports_work(server)
            started = time.monotonic()
            for sock in idle:
                assert answer(sock, HEADER_TIMEOUT_S + MARGIN_S) is not None  # closed (after a GOAWAY)
            assert time.monotonic() - started < HEADER_TIMEOUT_S + MARGIN_S
    finally:
        server.stop()


def body_head(server: ServerProcess, path: str) -> bytes:
    """A request's headers announcing 1000 body bytes, and the first two of them."""
    head = f"POST {path} HTTP/1.1\r\nHost: otel-rl\r\nAuthorization: Bearer {server.token}\r\n"
    return (head + "Content-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n").encode() + b"{}"


def test_a_body_that_stops_arriving_or_a_client_that_leaves_is_one_log_line(tmp_path):
    server = guarded_server(tmp_path)
    try:
        with slow_clients(server, 3, "127.0.0.1", body_head(server, "/v1/traces")) as stalled:
            started = time.monotonic()
            assert [answer(sock, BODY_TIMEOUT_S + MARGIN_S) for sock in stalled] == [b""] * 3  # closed
            assert time.monotonic() - started < BODY_TIMEOUT_S + MARGIN_S
        with slow_clients(server, 2, "127.0.0.1", body_head(server, "/v1/chat/completions")):
            server.wait_for_requests_in_flight(2, "the server reading both bodies")  # then they leave
        exports_work(server)
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    timed_out = "POST /v1/traces from 127.0.0.1: closed after 2 body bytes: no request body bytes within 2 s"
    left = "POST /v1/chat/completions from 127.0.0.1: closed after 2 body bytes: the client left"
    assert (log.count(timed_out), log.count(left), log.count("closed after")) == (3, 2, 5), log


def test_oversized_headers_are_refused_before_they_are_buffered(tmp_path):
    server = guarded_server(tmp_path)
    try:
        with slow_clients(server, 1, "127.0.0.1", HALF_REQUEST + b"x" * (80 * 1024)) as [sock]:
            assert status_of(answer(sock, 5)) == 431
    finally:
        server.stop()


def stream_chat(server: ServerProcess, results: list, errors: list) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    try:
        with httpx.stream("POST", f"{server.http_url}/v1/chat/completions", json=body, headers=server.auth,
                          timeout=60) as response:  # fmt: skip
            results.append("".join(response.iter_text()))
    except httpx.HTTPError as error:
        errors.append(error)


def test_a_stream_longer_than_every_read_deadline_is_not_cut(tmp_path):
    with FakeVLLM(lambda request, index: "one two three four five six seven eight") as fake:
        fake.inject(Fault(chunk_delay_s=0.5))  # about 5 s of chunks: more than both deadlines
        server = guarded_server(tmp_path, "--vllm", fake.url)
        try:
            results, errors = [], []
            stream_chat(server, results, errors)
        finally:
            server.stop()
    assert not errors and results[0].rstrip().endswith("data: [DONE]"), (errors, results)
    assert "eight" in results[0]


def test_sigterm_under_load_ends_the_server_within_the_shutdown_timeout(tmp_path):
    with FakeVLLM(lambda request, index: "word " * 200) as fake:
        fake.inject(*[Fault(chunk_delay_s=0.5)] * 4)  # streams of 100 s
        flags = ("--vllm", fake.url, "--shutdown-timeout", "2", "--query-timeout", "60")
        server = guarded_server(tmp_path, *flags)
        results, errors = [], []
        load = [threading.Thread(target=stream_chat, args=(server, results, errors)) for _ in range(4)]
        load.append(
            threading.Thread(  # a query of hours, stopped at 60 s
                target=httpx.post,
                args=(f"{server.http_url}/v1/query",),
                kwargs={"json": {"sql": SLOW_SQL}, "headers": server.auth, "timeout": 90},
            )
        )
        for client in load:
            client.start()
        try:
            deadline = time.monotonic() + 30
            while len(fake.requests) < 4:
                assert time.monotonic() < deadline, f"{len(fake.requests)} of 4 streams reached the upstream"
                time.sleep(0.05)
            server.wait_for_requests_in_flight(4 + 1, "the streams and the query")
            with (
                slow_clients(server, 100, "127.0.0.2"),
                slow_clients(server, 5, "127.0.0.3", body_head(server, "/v1/traces")),
            ):
                # and the 5 stalled bodies, before their body timeout (the others never end their headers)
                server.wait_for_requests_in_flight(4 + 1 + 5, "the stalled bodies", timeout_s=BODY_TIMEOUT_S)
                started = time.monotonic()
                server.process.send_signal(signal.SIGTERM)
                code = server.process.wait(30)
                took = time.monotonic() - started
        finally:
            server.kill()
        for client in load:
            client.join(10)
    assert code in (0, -signal.SIGTERM), server.log()
    assert took < 2 + 8, f"the server took {took:.1f} s to stop:\n{server.log()}"


def test_view_and_sql_queries_under_ingest_load_end_at_the_query_timeout(tmp_path):
    # Readers waiting for the normalized tables ran the normalizer's rounds themselves, past their limit
    server = guarded_server(tmp_path, "--query-timeout", str(QUERY_TIMEOUT_S), "--query-concurrency", "1")
    stop = threading.Event()

    def ingest() -> None:
        headers = server.auth | {"content-type": "application/x-protobuf"}
        with httpx.Client(headers=headers, timeout=60) as client:
            while not stop.is_set():
                request, _ = spans_request(3000, rollout_ids=[f"load-{uuid.uuid4().hex}"] * 3000)
                client.post(f"{server.http_url}/v1/traces", content=request.SerializeToString())

    loaders = [threading.Thread(target=ingest) for _ in range(3)]
    timings: list[tuple[str, int, float]] = []

    def timed(method: str, path: str, **kwargs) -> httpx.Response:
        started = time.monotonic()
        response = httpx.request(
            method, f"{server.http_url}{path}", headers=server.auth, timeout=60, **kwargs
        )
        timings.append((path, response.status_code, time.monotonic() - started))
        return response

    try:
        seed, _ = spans_request(10, rollout_ids=["seed"] * 10)
        headers = server.auth | {"content-type": "application/x-protobuf"}
        httpx.post(f"{server.http_url}/v1/traces", content=seed.SerializeToString(), headers=headers)
        # The seed's rollout, once the normalizer has made it (on a loaded machine past the 2 s query limit).
        seeded = {"sql": "SELECT count(*) AS n FROM rollouts WHERE rollout_id = 'seed'"}
        deadline = time.monotonic() + 30
        while (reply := timed("POST", "/v1/query", json=seeded)).status_code != 200:
            assert reply.status_code in (408, 503) and time.monotonic() < deadline, reply.text
        timings.clear()  # the load is not on yet
        assert pa.ipc.open_stream(reply.content).read_all().column("n").to_pylist() == [1]
        for loader in loaders:
            loader.start()
        until = time.monotonic() + 12
        while time.monotonic() < until:
            timed("GET", "/ui/api/rollouts?limit=20")
            timed("GET", "/ui/api/rollouts/seed")
            timed("POST", "/v1/query", json={"sql": "SELECT count(*) FROM llm_calls"})
    finally:
        stop.set()
        for loader in loaders:
            if loader.ident is not None:  # started
                loader.join(60)
        server.stop()
    assert {status for _, status, _ in timings} <= {200, 408, 503}, timings
    slowest = max(timings, key=lambda timing: timing[2])
    assert slowest[2] < QUERY_TIMEOUT_S + QUERY_MARGIN_S, (slowest, len(timings))


def test_the_web_views_queries_take_the_same_concurrency_slots_as_sql(tmp_path):
    server = guarded_server(tmp_path, "--query-timeout", "4", "--query-concurrency", "1")
    holding = threading.Thread(
        target=httpx.post,
        args=(f"{server.http_url}/v1/query",),
        kwargs={"json": {"sql": SLOW_SQL}, "headers": server.auth, "timeout": 30},
    )
    try:
        holding.start()
        server.wait_for_requests_in_flight(1, "the slow query holding the one slot")
        page = httpx.get(f"{server.http_url}/ui/api/rollouts", headers=server.auth, timeout=30)
        assert page.status_code == 429 and "--query-concurrency" in page.text, page.text
        holding.join(30)
        assert (
            httpx.get(f"{server.http_url}/ui/api/rollouts", headers=server.auth, timeout=30).status_code
            == 200
        )
    finally:
        server.stop()


def test_a_reload_failing_on_every_server_keeps_the_policy_and_the_servers_and_the_next_one_succeeds(
    tmp_path,
):
    empty, good = tmp_path / "no-weights", tmp_path / "checkpoint"
    empty.mkdir(), good.mkdir()
    (good / "model.safetensors").write_bytes(b"new weights")
    with FakeVLLM(dev_mode=True) as fake:
        server = guarded_server(tmp_path, "--vllm", fake.url)
        policy_url = f"{server.http_url}/v1/admin/policy"
        try:
            failed = httpx.post(
                policy_url, json={"version": 1, "checkpoint": str(empty)}, headers=server.auth
            )
            assert failed.status_code == 502, failed.text
            assert "Cannot find any model weights" in failed.json()["servers"][0]["error"]

            policy = httpx.get(policy_url, headers=server.auth).json()
            assert policy["version"] == 0 and policy["servers"][0]["available"], policy
            assert not fake.paused
            results, errors = [], []
            stream_chat(server, results, errors)  # the old policy still answers
            assert not errors and results[0].rstrip().endswith("data: [DONE]")

            reloaded = httpx.post(
                policy_url, json={"version": 1, "checkpoint": str(good)}, headers=server.auth
            )
            assert reloaded.status_code == 200, reloaded.text
            assert reloaded.json()["servers"][0]["weights_changed"] is True
            assert httpx.get(policy_url, headers=server.auth).json()["version"] == 1
            metrics = httpx.get(f"{server.http_url}/metrics", headers=server.auth).text
            assert 'otel_rl_gateway_reloads_total{outcome="failed"} 1.0' in metrics
        finally:
            server.stop()
    assert "reload to version 1 failed on every server; version 0 stays, on 1 of 1 servers" in server.log()
