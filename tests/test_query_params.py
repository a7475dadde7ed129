"""Parameters DuckDB binds, through a real `otel-rl serve`'s /v1/query and from a store file: only values."""

import duckdb
import httpx
import pytest
from test_collector_http import PROTOBUF, post, spans_request

from otel_rl.collector.ingest import ingest_traces
from otel_rl.query import QueryError, query
from otel_rl.query_api import MAX_PARAM_CHARS, MAX_PARAMS
from otel_rl.store import Store
from otel_rl.store.sandbox import reads_raw_tables_only

HOSTILE = "x'; DROP TABLE spans; --"


def ask(server, body: dict) -> httpx.Response:
    return httpx.post(
        f"{server.http_url}/v1/query",
        json=body,
        headers={**server.auth, "Accept": "application/json"},
        timeout=60,
    )


@pytest.fixture(scope="module")
def stored_trace(otel_rl_server) -> str:
    request, trace_id = spans_request(3)
    assert post(otel_rl_server, "/v1/traces", request.SerializeToString(), PROTOBUF).status_code == 200
    return trace_id


def test_positional_and_named_parameters_select_the_rows_of_their_values(
    otel_rl_server, stored_trace
) -> None:
    positional = ask(
        otel_rl_server,
        {
            "sql": "SELECT name FROM spans WHERE trace_id = $1 AND name <> ? ORDER BY name",
            "params": [stored_trace, "span 1"],
        },
    )
    named = ask(
        otel_rl_server,
        {"sql": "SELECT count(*) AS n FROM spans WHERE trace_id = $trace", "params": {"trace": stored_trace}},
    )

    assert positional.status_code == 200, positional.text
    assert [row["name"] for row in positional.json()] == ["span 0", "span 2"]
    assert named.json() == [{"n": 3}]


def test_an_id_carrying_a_quote_and_a_drop_is_only_a_value(otel_rl_server, stored_trace) -> None:
    hostile = ask(
        otel_rl_server, {"sql": "SELECT count(*) AS n FROM spans WHERE trace_id = $1", "params": [HOSTILE]}
    )
    echoed = ask(otel_rl_server, {"sql": "SELECT $1 AS id", "params": [HOSTILE]})
    spans = ask(
        otel_rl_server,
        {"sql": "SELECT count(*) AS n FROM spans WHERE trace_id = $1", "params": [stored_trace]},
    )

    assert hostile.json() == [{"n": 0}]  # no span has that id, and the statement after the quote never ran
    assert echoed.json() == [{"id": HOSTILE}]
    assert spans.json() == [{"n": 3}]  # the table is still there


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ([1] * (MAX_PARAMS + 1), f"at most {MAX_PARAMS} items"),
        (["x" * (MAX_PARAM_CHARS + 1)], f"at most {MAX_PARAM_CHARS} characters"),
        ([["a", "b"]], "valid string"),  # a list as a value: scalars only
        ([{"a": 1}], "valid string"),
        ({"no spaces": 1}, "should match pattern"),
    ],
)
def test_parameters_beyond_their_bounds_are_refused_with_what_is_wrong(otel_rl_server, params, named) -> None:
    response = ask(otel_rl_server, {"sql": "SELECT 1", "params": params})

    assert response.status_code == 422
    assert named in response.text and "params" in response.text


def test_a_parameter_without_its_value_fails_as_the_query_s_error(otel_rl_server) -> None:
    missing = ask(otel_rl_server, {"sql": "SELECT $1 AS a, $2 AS b", "params": ["only one"]})

    assert missing.status_code == 400 and "query failed" in missing.json()["detail"]


def test_otel_rl_query_binds_through_the_server_and_from_a_file(
    otel_rl_server, stored_trace, tmp_path
) -> None:
    through = query(
        "SELECT count(*) AS n FROM spans WHERE trace_id = ?",
        [stored_trace],
        server=otel_rl_server.http_url,
        token=otel_rl_server.token,
    )
    db = tmp_path / "file.duckdb"
    request, trace_id = spans_request(2)
    with Store(db) as store:
        ingest_traces(store, request)
    from_file = query("SELECT count(*) AS n FROM spans WHERE trace_id = $t", {"t": trace_id}, db=db)
    hostile = query("SELECT count(*) AS n FROM spans WHERE trace_id = $1", [HOSTILE], db=db)

    assert through.to_dicts() == [{"n": 3}]
    assert from_file.to_dicts() == [{"n": 2}]
    assert hostile.to_dicts() == [{"n": 0}]
    with pytest.raises(QueryError, match="query failed"):
        query("SELECT $1, $2", [1], db=db)


def test_a_statement_with_parameters_is_still_known_to_read_raw_tables_only() -> None:
    con = duckdb.connect()

    assert reads_raw_tables_only(con, "SELECT * FROM spans WHERE trace_id = $1 AND name IN (?, ?)")
    assert reads_raw_tables_only(con, "SELECT '?' AS q, $named FROM logs")
    assert not reads_raw_tables_only(con, "SELECT * FROM rollouts WHERE rollout_id = $1")
