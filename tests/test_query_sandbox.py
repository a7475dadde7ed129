"""The query sandbox: user SQL cannot change the store or reach outside it, and stops within its limits."""

import base64
import hashlib
import json
import subprocess
import threading
import time

import httpx
import pytest
from otel_rl_server import OTEL_RL, ServerProcess
from test_collector_http import PROTOBUF, post, spans_request

from otel_rl.auth import Auth
from otel_rl.collector.ingest import ingest_traces
from otel_rl.query import QueryError, query
from otel_rl.store import Store

QUERY_TIMEOUT_S = 4
SLOW = "SELECT sum(a.range * b.range) FROM range(1000000) a, range(1000000) b"  # 10^12 rows: hours
PLANTED_KEY = "orl-rk-planted-by-a-query"
PLANTED_HASH = hashlib.sha256(PLANTED_KEY.encode()).hexdigest()

# Each hides a change to the store, or a reach outside it, in a construct DuckDB accepts.
HIDDEN = {
    "cte delete": "WITH d AS (DELETE FROM spans RETURNING *) SELECT count(*) FROM d",
    "cte update": "WITH u AS (UPDATE spans SET name = 'x' RETURNING *) SELECT count(*) FROM u",
    "cte insert of a rollout key": (
        "WITH k AS (INSERT INTO rollout_keys (key_hash, rollout_id, created_at, expires_at)"
        f" VALUES ('{PLANTED_HASH}', 'rollout-x', now(), now() + INTERVAL 1 DAY) RETURNING *) SELECT * FROM k"
    ),
    "cte delete of rollout keys": "WITH d AS (DELETE FROM rollout_keys RETURNING *) SELECT * FROM d",
    "cte delete of key revocations": (
        "WITH d AS (DELETE FROM rollout_key_revocations RETURNING *) SELECT * FROM d"
    ),
    "subquery": "SELECT * FROM (WITH d AS (DELETE FROM spans RETURNING *) SELECT * FROM d)",
    "query()": "SELECT * FROM query('DELETE FROM spans')",
    "prepare": "PREPARE p AS DELETE FROM spans",
    "execute": "EXECUTE p",
    "explain analyze": "EXPLAIN ANALYZE DELETE FROM spans",
    "create table as": "CREATE TABLE copied AS SELECT * FROM spans",
    "delete": "DELETE FROM spans",
    "drop": "DROP TABLE spans",
    "two statements": "SELECT 1; DELETE FROM spans",
    "copy to": "COPY spans TO '{tmp}/copied.csv'",
    "copy select to": "COPY (SELECT * FROM spans) TO '{tmp}/copied.parquet'",
    "attach": "ATTACH '{tmp}/other.duckdb' AS other",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "set": "SET enable_external_access = true",
    "pragma": "PRAGMA enable_profiling",
    "call": "CALL checkpoint()",
    "read_text": "SELECT * FROM read_text('{tmp}/secret.txt')",
    "read_csv": "SELECT * FROM read_csv('{tmp}/secret.txt')",
    "read_json": "SELECT * FROM read_json('{tmp}/secret.json')",
    "read_parquet": "SELECT * FROM read_parquet('{tmp}/secret.parquet')",
    "a path as a table": "SELECT * FROM '{tmp}/secret.txt'",
    "glob": "SELECT * FROM glob('{tmp}/*')",
    "read_blob": "SELECT * FROM read_blob('{tmp}/secret.txt')",
    "a URL": "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')",
}


@pytest.fixture(scope="module")
def sandboxed(tmp_path_factory) -> ServerProcess:
    """A server with small query limits (2 at once, 1 MB results): spans, rollout keys, a revocation."""
    workdir = tmp_path_factory.mktemp("sandbox")
    (workdir / "secret.txt").write_text("host secret\n")
    (workdir / "secret.json").write_text('{"secret": 1}\n')
    with Store(workdir / "otel_rl.duckdb") as store:
        auth = Auth(store, "admin")
        auth.issue_rollout_key("rollout-1")
        auth.issue_rollout_key("rollout-2")
        auth.revoke_rollout_keys("rollout-2", None, "revoked by the admin")  # a revocation to delete
        ingest_traces(store, spans_request(5)[0])
    flags = (
        "--query-timeout",
        str(QUERY_TIMEOUT_S),
        "--query-max-bytes",
        "1000000",
        "--query-concurrency",
        "2",
    )
    server = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=flags).start()
    yield server
    server.stop()


def store_counts(server: ServerProcess) -> tuple[int, ...]:
    tables = ("spans", "rollout_keys", "rollout_key_revocations")
    return tuple(server.scalar(f"SELECT count(*) FROM {table}") for table in tables)


def ask(server: ServerProcess, sql: str, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{server.http_url}/v1/query", json={"sql": sql}, headers={**server.auth, **headers}, timeout=30
    )


def test_hidden_writes_and_outside_reads_are_refused_through_the_server(sandboxed) -> None:
    tmp = sandboxed.workdir
    before = store_counts(sandboxed)

    for case, sql in HIDDEN.items():
        response = ask(sandboxed, sql.format(tmp=tmp))

        assert response.status_code == 400, (case, response.text)
        assert response.json()["detail"].startswith(("query refused: ", "query failed: ")), case

    assert store_counts(sandboxed) == before
    assert not list(tmp.glob("copied*")) and not (tmp / "other.duckdb").exists()
    planted = post(
        sandboxed, "/v1/traces", spans_request(1)[0].SerializeToString(), PROTOBUF, token=PLANTED_KEY
    )
    assert planted.status_code == 401


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("cte delete", "queries cannot change the store"),
        ("cte insert of a rollout key", "queries cannot change the store"),
        ("read_text", "queries cannot reach files, URLs, other databases or extensions"),
        ("glob", "queries cannot reach files"),
        ("a URL", "queries cannot reach files"),
        ("copy to", "only read queries are allowed"),
    ],
)
def test_each_refusal_says_which_rule_it_broke(sandboxed, case, message) -> None:
    response = ask(sandboxed, HIDDEN[case].format(tmp=sandboxed.workdir))

    assert response.status_code == 400
    assert message in response.json()["detail"]


def test_hidden_writes_and_outside_reads_are_refused_on_a_file_without_a_server(tmp_path) -> None:
    db = tmp_path / "otel_rl.duckdb"
    (tmp_path / "secret.txt").write_text("host secret\n")
    with Store(db) as store:
        ingest_traces(store, spans_request(3)[0])

    for sql in HIDDEN.values():
        with pytest.raises(QueryError, match="query refused|query failed|only read|exactly one|parsed"):
            query(sql.format(tmp=tmp_path), db=db)

    assert query("SELECT count(*) AS n FROM spans", db=db).to_dicts() == [{"n": 3}]
    assert not list(tmp_path.glob("copied*")) and not (tmp_path / "other.duckdb").exists()
    refused = subprocess.run(
        [str(OTEL_RL), "sql", f"SELECT * FROM read_text('{tmp_path}/secret.txt')", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "queries cannot reach files" in refused.stderr
    assert "host secret" not in refused.stdout


def test_a_query_past_the_time_limit_is_stopped_with_408(sandboxed) -> None:
    started = time.monotonic()

    response = ask(sandboxed, SLOW)

    assert response.status_code == 408, response.text
    assert "longer than 4 s" in response.json()["detail"] and "--query-timeout" in response.json()["detail"]
    assert time.monotonic() - started < QUERY_TIMEOUT_S + 2


def test_abandoned_queries_are_stopped_and_exports_and_health_stay_responsive(sandboxed) -> None:
    def abandon() -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{sandboxed.http_url}/v1/query", json={"sql": SLOW}, headers=sandboxed.auth, timeout=0.5
            )

    abandoning = [threading.Thread(target=abandon) for _ in range(45)]
    for thread in abandoning:
        thread.start()
    for thread in abandoning:
        thread.join()

    started = time.monotonic()
    assert httpx.get(f"{sandboxed.http_url}/healthz", timeout=1).status_code == 200
    request, trace_id = spans_request(2)
    export = httpx.post(
        f"{sandboxed.http_url}/v1/traces",
        content=request.SerializeToString(),
        headers={**PROTOBUF, **sandboxed.auth},
        timeout=1,
    )
    assert export.status_code == 200
    assert time.monotonic() - started < 1
    # The abandoned queries were stopped when their clients left, not at their time limit: a slot is free
    # well before it.
    answered = time.monotonic()
    assert sandboxed.scalar(f"SELECT count(*) FROM spans WHERE trace_id = '{trace_id}'") == 2
    assert time.monotonic() - answered < QUERY_TIMEOUT_S - 1


def test_more_queries_than_the_bound_wait_briefly_then_get_429(sandboxed) -> None:
    sandboxed.wait_for_requests_in_flight(0, "the earlier tests' requests to end")
    running = [threading.Thread(target=ask, args=(sandboxed, SLOW)) for _ in range(2)]
    for thread in running:
        thread.start()
    sandboxed.wait_for_requests_in_flight(2, "both slow queries running", timeout_s=QUERY_TIMEOUT_S - 2)

    response = ask(sandboxed, "SELECT 1")

    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert "too many queries: 2 are running" in response.json()["detail"]
    for thread in running:
        thread.join()


def test_a_result_over_the_size_bound_is_refused_with_413_naming_limit(sandboxed) -> None:
    response = ask(sandboxed, "SELECT range, repeat('x', 100) AS padding FROM range(10000000)")

    assert response.status_code == 413
    assert "larger than 1,000,000 bytes" in response.json()["detail"] and "LIMIT" in response.json()["detail"]
    assert ask(sandboxed, "SELECT range FROM range(1000)").status_code == 200


def test_json_answers_carry_binary_values_as_base64(sandboxed) -> None:
    sql = "SELECT 'ab'::BLOB AS b, ['\\x00\\xFF'::BLOB] AS l, {'k': 'c'::BLOB} AS s, 1 AS i"

    response = ask(sandboxed, sql, Accept="application/json")

    assert response.status_code == 200, response.text
    [row] = response.json()
    assert row == {"b": "YWI=", "l": [base64.b64encode(b"\x00\xff").decode()], "s": {"k": "Yw=="}, "i": 1}


def test_otel_rl_sql_reads_the_token_from_the_file_otel_rl_token_file_names(sandboxed, tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(sandboxed.token + "\n")

    done = subprocess.run(
        [str(OTEL_RL), "sql", "SELECT 41 + 1 AS n", "--server", sandboxed.http_url, "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"OTEL_RL_TOKEN_FILE": str(token_file), "PATH": ""},
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["n", "42"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/query", {"sql": 5}),
        ("POST", "/v1/rewards", {"value": "not a number"}),
        ("POST", "/v1/admin/policy", {"version": "x"}),
        ("POST", "/v1/admin/rollouts/r1/key", {"split": ["not", "a", "string"]}),
        # not JSON at all: FastAPI parses a body before it runs any dependency
        ("POST", "/v1/query", b'{"sql": '),
        ("POST", "/v1/rewards", b"\xff\xfe"),
    ],
)
def test_admin_endpoints_check_the_token_before_the_body(sandboxed, method, path, body) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()

    def send(**headers: str) -> httpx.Response:
        headers = {"Content-Type": "application/json", **headers}
        return httpx.request(method, sandboxed.http_url + path, content=content, headers=headers, timeout=10)

    without, unknown, with_admin = send(), send(Authorization="Bearer unknown"), send(**sandboxed.auth)

    assert without.status_code == 401, without.text
    assert without.headers["www-authenticate"] == "Bearer"
    assert unknown.status_code == 401, unknown.text
    assert with_admin.status_code == 422


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/metrics"])
def test_docs_and_metrics_need_the_admin_token(sandboxed, path) -> None:
    url = sandboxed.http_url + path

    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    assert httpx.get(url, headers=sandboxed.auth, timeout=10).status_code == 200


def test_public_docs_and_metrics_when_asked_and_shutdown_does_not_wait_for_a_query(tmp_path) -> None:
    flags = ("--public-docs", "--public-metrics", "--query-timeout", "600")
    server = ServerProcess(tmp_path / "otel_rl.duckdb", tmp_path, flags=flags).start()
    try:
        for path in ("/docs", "/openapi.json", "/metrics"):
            assert httpx.get(server.http_url + path, timeout=10).status_code == 200
        assert "/v1/query" in httpx.get(server.http_url + "/openapi.json", timeout=10).json()["paths"]
        answers: list[httpx.Response] = []
        slow = threading.Thread(target=lambda: answers.append(ask(server, SLOW)))
        slow.start()
        server.wait_for_requests_in_flight(1, "the slow query running")
        started = time.monotonic()
    finally:
        server.stop(timeout=10)
    assert time.monotonic() - started < 5
    slow.join(5)
    assert answers[0].status_code == 503 and "shutting down" in answers[0].json()["detail"]
