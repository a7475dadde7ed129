"""The store: group commit, isolation of a bad batch, back-pressure, dedup, read-only queries, views, keys."""

import os
import re
import stat
import threading
from concurrent.futures import ThreadPoolExecutor

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_collector_http import spans_request

from otel_rl.auth import Auth, Unauthorized, admin_token
from otel_rl.collector.ingest import ingest_logs, ingest_traces, traces_batch
from otel_rl.store import ReadOnlyViolation, Saturated, Store
from otel_rl.store.store import normalized_lag
from otel_rl.store.writer import GroupCommitWriter


@pytest.fixture
def store(tmp_path) -> Store:
    with Store(tmp_path / "store.duckdb", transforms_dir=tmp_path / "no-transforms") as opened:
        yield opened


def rows(n: int, start: int = 0) -> pa.Table:
    return pa.table({"x": list(range(start, start + n))})


@pytest.fixture
def held_writer(tmp_path):
    """A writer over a real DuckDB table whose first insert waits for `release`, so that batches pile up."""
    con = duckdb.connect(str(tmp_path / "writer.duckdb"))
    con.execute("CREATE TABLE t (x INTEGER NOT NULL)")
    entered, release = threading.Event(), threading.Event()

    def insert(
        cursor: duckdb.DuckDBPyConnection, tables: dict[str, pa.Table], *, dedup: bool, commit_seq: int
    ) -> None:
        entered.set()
        release.wait(10)
        for table, batch in tables.items():
            cursor.register("batch", batch)
            cursor.execute(f"INSERT INTO {table} SELECT * FROM batch")

    writer = GroupCommitWriter(
        con.cursor(), insert, max_pending_bytes=1000, reopen=con.cursor, last_commit_seq=0, on_commit=print
    )
    yield writer, con, entered, release
    release.set()
    writer.close()


def test_batches_that_wait_together_are_committed_in_one_transaction(held_writer) -> None:
    writer, con, entered, release = held_writer
    first = writer.submit({"t": rows(1)})
    entered.wait(10)
    waiting = [writer.submit({"t": rows(2, start=10 * i)}) for i in range(1, 5)]

    release.set()
    for future in [first, *waiting]:
        future.result(10)

    assert writer.commits == 2
    assert con.execute("SELECT count(*) FROM t").fetchone() == (9,)


def test_a_bad_batch_fails_alone_and_its_group_is_still_committed(held_writer) -> None:
    writer, con, entered, release = held_writer
    first = writer.submit({"t": rows(1)})
    entered.wait(10)
    good = writer.submit({"t": rows(2, start=100)})
    bad = writer.submit({"no_such_table": rows(1)})
    also_good = writer.submit({"t": rows(3, start=200)})

    release.set()

    for future in (first, good, also_good):
        assert future.result(10) is None
    with pytest.raises(duckdb.CatalogException, match="no_such_table"):
        bad.result(10)
    assert con.execute("SELECT count(*) FROM t").fetchone() == (6,)


def test_a_cancelled_write_is_skipped_and_the_writer_keeps_going(held_writer) -> None:
    writer, con, entered, release = held_writer
    writer.submit({"t": rows(1)})
    entered.wait(10)
    abandoned = writer.submit({"t": rows(5, start=100)})
    assert abandoned.cancel()  # what asyncio does when the HTTP client goes away

    release.set()

    writer.submit({"t": rows(2, start=200)}).result(10)
    assert con.execute("SELECT count(*) FROM t").fetchone() == (3,)


def test_a_full_queue_refuses_with_saturated_until_the_writer_catches_up(held_writer) -> None:
    writer, con, entered, release = held_writer
    writer.submit({"t": rows(1)})
    entered.wait(10)
    queued = writer.submit({"t": rows(200)})  # 800 bytes of the 1000 allowed

    with pytest.raises(Saturated, match="ingest queue is full") as refused:
        writer.submit({"t": rows(100)})
    assert refused.value.retry_after > 0

    release.set()
    queued.result(10)
    writer.submit({"t": rows(100)}).result(10)


def test_logs_sent_twice_are_stored_once_and_numbered_in_arrival_order(tmp_path) -> None:
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add().scope_logs.add().log_records
    for i in range(3):
        records.add(observed_time_unix_nano=i + 1).body.string_value = f"record {i}"
    with Store(tmp_path / "logs.duckdb") as store:
        ingest_logs(store, request)
        ingest_logs(store, request)
    with Store(tmp_path / "logs.duckdb") as reopened:
        records.add(observed_time_unix_nano=9).body.string_value = "record 3"
        ingest_logs(reopened, request)
        stored = reopened.query_arrow("SELECT seq, body FROM logs ORDER BY seq").to_pylist()

    assert [row["body"] for row in stored] == ['"record 0"', '"record 1"', '"record 2"', '"record 3"']
    assert [row["seq"] for row in stored] == sorted({row["seq"] for row in stored})


def test_a_store_whose_last_commit_was_all_duplicates_has_no_normalizing_to_do(tmp_path) -> None:
    request = ExportLogsServiceRequest()
    request.resource_logs.add().scope_logs.add().log_records.add(observed_time_unix_nano=1)
    with Store(tmp_path / "dup.duckdb") as store:
        ingest_logs(store, request)
        ingest_logs(store, request)  # numbered, stores nothing: the watermark passes the last stored commit

    assert normalized_lag(tmp_path / "dup.duckdb") == 0  # it said -1, and every `otel-rl sql --db` caught up


def calls_request(*span_ids: int) -> ExportTraceServiceRequest:
    """Call spans of one trace, span i starting at i ns with a prompt of i token ids."""
    out = ExportTraceServiceRequest()
    spans = out.resource_spans.add().scope_spans.add().spans
    for span_id in span_ids:
        span = spans.add(trace_id=b"\x01" * 16, span_id=span_id.to_bytes(8, "big"), name="chat m")
        span.start_time_unix_nano = span_id
        packed = span.attributes.add(key="otel_rl.prompt_token_ids")
        packed.value.bytes_value = np.arange(span_id, dtype="<i4").tobytes()
    return out


def test_a_call_sent_again_stores_its_tokens_once_and_a_new_call_beside_it_stores_its_own(tmp_path) -> None:
    request = calls_request
    with Store(tmp_path / "tokens.duckdb") as store:
        ingest_traces(store, request(3))
        ingest_traces(store, request(3))
    with Store(tmp_path / "tokens.duckdb") as reopened:
        ingest_traces(reopened, request(3, 5))
        stored = reopened.query_arrow(
            "SELECT span_id, prompt_token_ids FROM call_tokens ORDER BY span_id"
        ).to_pylist()

    assert [(row["span_id"], len(row["prompt_token_ids"])) for row in stored] == [
        ("0000000000000003", 3),
        ("0000000000000005", 5),
    ]


def test_fresh_rows_and_exports_waiting_together_are_both_stored_the_exports_deduplicated(tmp_path) -> None:
    request = calls_request
    with Store(tmp_path / "mixed.duckdb") as store:
        ingest_traces(store, request(1))
        # an export sent again, the gateway's fresh rows (ids drawn by it), a new export: submitted together
        exported, fresh, new = (traces_batch(request(*ids), "admin") for ids in ((1,), (2, 3), (4,)))
        futures = [store.submit(exported), store.submit(fresh, dedup=False), store.submit(new)]
        for future in futures:
            future.result(10)
        stored = store.query_arrow(
            "SELECT s.span_id, len(t.prompt_token_ids) AS n FROM spans s "
            "JOIN call_tokens t USING (trace_id, span_id) ORDER BY s.span_id"
        ).to_pylist()

    assert [(int(row["span_id"], 16), row["n"]) for row in stored] == [(1, 1), (2, 2), (3, 3), (4, 4)]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("DELETE FROM spans", "this is a DELETE statement"),
        ("INSERT INTO spans (trace_id, span_id) VALUES ('a', 'b')", "this is a INSERT statement"),
        ("EXPLAIN ANALYZE DELETE FROM spans", "this is a EXPLAIN statement"),
        ("SELECT 1; DROP TABLE spans", "exactly one statement (got 2)"),
        ("ATTACH 'other.duckdb'", "this is a ATTACH statement"),
        ("SELEC 1", "could not be parsed"),
    ],
)
def test_queries_that_are_not_one_read_are_refused_and_change_nothing(store, sql, message) -> None:
    request, _ = spans_request(2)
    ingest_traces(store, request)

    with pytest.raises(ReadOnlyViolation, match=re.escape(message)):
        store.query_arrow(sql)

    assert store.query_arrow("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 2}]


def test_views_come_from_the_transforms_folder_in_name_order_and_a_broken_one_does_not_stop_ingest(
    tmp_path,
) -> None:
    transforms = tmp_path / "transforms"
    transforms.mkdir()
    (transforms / "10_names.sql").write_text("CREATE OR REPLACE VIEW span_names AS SELECT name FROM spans;")
    (transforms / "20_upper.sql").write_text(
        "CREATE OR REPLACE VIEW upper_names AS SELECT upper(name) AS u FROM span_names;"
    )
    (transforms / "30_broken.sql").write_text("CREATE OR REPLACE VIEW broken AS SELECT nope FROM spans;")

    with Store(tmp_path / "views.duckdb", transforms_dir=transforms) as store:
        request, _ = spans_request(1)
        ingest_traces(store, request)

        assert store.views["10_names.sql"] is None and store.views["20_upper.sql"] is None
        assert "nope" in store.views["30_broken.sql"]
        assert store.query_arrow("SELECT u FROM upper_names").to_pylist() == [{"u": "SPAN 0"}]


def test_an_admin_token_is_generated_once_into_a_private_file(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OTEL_RL_TOKEN", raising=False)
    token_file = tmp_path / ".otel_rl" / "token"

    token, source = admin_token(None, token_file)
    again, again_source = admin_token(None, token_file)

    assert len(token) >= 32 and again == token
    assert source.endswith("(new)") and again_source == str(token_file)
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    assert admin_token("explicit", token_file) == ("explicit", "--token")


def test_rollout_keys_authenticate_as_their_rollout_and_unknown_tokens_do_not(store) -> None:
    auth = Auth(store, "admin")
    key = auth.issue_rollout_key("rollout-7")

    assert auth.authenticate("Bearer admin").admin
    principal = auth.authenticate(f"Bearer {key}")
    assert not principal.admin and principal.rollout_id == "rollout-7"
    assert Auth(store, "admin").authenticate(f"Bearer {key}").rollout_id == "rollout-7"
    assert store.query_arrow(
        f"SELECT count(*) AS n FROM rollout_keys WHERE key_hash = '{key}'"
    ).to_pylist() == [{"n": 0}]
    for header in (None, "", "Bearer", "Basic admin", "Bearer not-a-key"):
        with pytest.raises(Unauthorized):
            auth.authenticate(header)


def test_concurrent_ingest_from_many_threads_stores_everything(store) -> None:
    requests = [spans_request(30) for _ in range(40)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda r: ingest_traces(store, r[0]), requests))

    assert [r.accepted for r in results] == [30] * 40
    assert store.query_arrow("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 1200}]
    assert store.commits <= 40


def test_views_are_recreated_on_open_from_the_first_changed_or_failed_file(tmp_path) -> None:
    transforms = tmp_path / "transforms"
    transforms.mkdir()
    (transforms / "10_a.sql").write_text("CREATE OR REPLACE VIEW a AS SELECT 1 AS v;")
    (transforms / "20_b.sql").write_text("CREATE OR REPLACE VIEW b AS SELECT nope;")
    (transforms / "30_c.sql").write_text("CREATE OR REPLACE VIEW c AS SELECT 3 AS v;")
    db = tmp_path / "views.duckdb"

    with Store(db, transforms_dir=transforms) as store:
        assert store.views["20_b.sql"] is not None
    (transforms / "20_b.sql").write_text("CREATE OR REPLACE VIEW b AS SELECT 2 AS v;")
    (transforms / "30_c.sql").write_text("CREATE OR REPLACE VIEW c AS SELECT 30 AS v;")
    with Store(db, transforms_dir=transforms) as store:
        assert store.views == {"10_a.sql": None, "20_b.sql": None, "30_c.sql": None}
        assert store.query_arrow("SELECT (SELECT v FROM b) AS b, (SELECT v FROM c) AS c").to_pylist() == [
            {"b": 2, "c": 30}
        ]
        store._con.execute("CREATE OR REPLACE VIEW a AS SELECT 'not rerun' AS v")
    with Store(db, transforms_dir=transforms) as store:
        assert store.query_arrow("SELECT v FROM a").to_pylist() == [{"v": "not rerun"}]
