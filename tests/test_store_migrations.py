"""Stores made by earlier versions open: the columns they lack are added with their values, and their rows
are normalized; and the online loop's read, bounded by time, gives the rows of the whole views."""

import time

import duckdb
import polars as pl
from from_scratch import differences
from rollout_traffic import rollout_requests

from otel_rl.collector.ingest import ingest_logs, ingest_traces
from otel_rl.store import Store
from otel_rl.store.definitions import NORMALIZED
from otel_rl.store.identity import IDENTITY_COLUMNS
from otel_rl.train.groups import read_groups


def ingest(store: Store, rollout_id: str, group_id: str, start_ns: int, *, with_client: bool = False) -> None:
    spans, reward = rollout_requests(rollout_id, start_ns, with_client=with_client, group_id=group_id)
    ingest_traces(store, spans)
    ingest_logs(store, reward)


def test_a_store_made_before_call_tokens_had_received_at_gets_it_from_the_spans(tmp_path) -> None:
    db = tmp_path / "store.duckdb"
    with Store(db) as store:
        ingest(store, "r-1", "g-1", time.time_ns())
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE call_tokens DROP COLUMN received_at")
    con.close()

    with Store(db) as store:
        filled = store.query_arrow(
            "SELECT count(*) FILTER (t.received_at IS NULL) AS missing,"
            " count(*) FILTER (t.received_at = s.received_at) AS from_spans"
            " FROM call_tokens t JOIN spans s USING (trace_id, span_id)"
        ).to_pylist()
        assert filled == [{"missing": 0, "from_spans": 2}]
        ingest(store, "r-2", "g-1", time.time_ns())  # and new rows are written with it
        assert store.query_arrow("SELECT count(received_at) AS n FROM call_tokens")["n"][0].as_py() == 4


def test_a_store_made_before_senders_were_recorded_opens_and_vouches_for_none_of_its_old_rows(
    tmp_path,
) -> None:
    db = tmp_path / "store.duckdb"
    with Store(db) as store:
        ingest(store, "r-old", "g-1", time.time_ns())
    con = duckdb.connect(str(db))
    for table in ("spans", "call_tokens", "logs", "metric_points"):
        con.execute(f"ALTER TABLE {table} DROP COLUMN sender")
    con.execute("DROP SCHEMA normalized CASCADE")  # normalized by the earlier version's views
    con.execute("DELETE FROM view_sources")
    con.close()

    with Store(db) as store:
        ingest(store, "r-new", "g-1", time.time_ns())  # the server's own rows, as the gateway writes them
        store.wait_normalized(timeout_s=60)
        senders = store.query_arrow(
            "SELECT attributes ->> 'otel_rl.rollout.id' AS rollout_id, list(DISTINCT sender) AS senders"
            " FROM spans GROUP BY 1 ORDER BY 1"
        ).to_pylist()
        assert senders == [
            {"rollout_id": "r-new", "senders": ["server"]},
            {"rollout_id": "r-old", "senders": [None]},
        ]
        # no one vouches for rows stored before: their token ids are not exact, their calls not the gateway's
        calls = store.query_arrow(
            "SELECT rollout_id, count(*) FILTER (dialect = 'gateway') AS gateway,"
            " count(prompt_token_ids) AS exact FROM llm_calls GROUP BY 1 ORDER BY 1"
        ).to_pylist()
        assert calls == [
            {"rollout_id": "r-new", "gateway": 2, "exact": 2},
            {"rollout_id": "r-old", "gateway": 0, "exact": 0},
        ]
    assert differences(db) == {name: (0, 0) for name in NORMALIZED}


def test_a_store_made_before_the_normalized_tables_numbers_its_rows_and_normalizes_them(tmp_path) -> None:
    db = tmp_path / "store.duckdb"
    start = time.time_ns()
    with Store(db) as store:
        for i in range(3):
            ingest(store, f"r-{i}", "g-1", start + i * 10**9, with_client=i == 1)
    # What an earlier version left: raw tables without commit numbers, views computed at query time.
    con = duckdb.connect(str(db))
    for table in ("spans", "call_tokens", "logs"):
        con.execute(f"ALTER TABLE {table} DROP COLUMN commit_seq")
    con.execute("DROP SCHEMA normalized CASCADE")
    con.execute("DELETE FROM view_sources")
    con.close()

    with Store(db) as store:
        numbered = store.query_arrow(
            "SELECT count(*) FILTER (commit_seq IS NULL) AS missing FROM"
            " (SELECT commit_seq FROM spans UNION ALL SELECT commit_seq FROM logs"
            " UNION ALL SELECT commit_seq FROM call_tokens)"
        ).to_pylist()
        assert numbered == [{"missing": 0}]
        rollouts = store.query_arrow("SELECT rollout_id, n_calls FROM rollouts ORDER BY 1").to_pylist()
        assert rollouts == [{"rollout_id": f"r-{i}", "n_calls": 2} for i in range(3)]
        ingest(store, "r-3", "g-1", time.time_ns())  # new rows after the old ones
    assert differences(db) == {name: (0, 0) for name in NORMALIZED}


def test_the_online_read_bounded_by_time_gives_the_rows_of_the_whole_views(tmp_path) -> None:
    with Store(tmp_path / "store.duckdb") as store:

        def query(sql: str, params: list | None = None) -> pl.DataFrame:
            return pl.from_arrow(store.query_arrow(sql, params))

        ingest(store, "old-1", "g-old", time.time_ns() - 3600 * 10**9)
        for i in range(3):
            ingest(store, f"new-{i}", "g-new", time.time_ns(), with_client=i == 0)
        calls, rollouts, rewards = read_groups(query, ["g-new"])
        whole_calls = query(
            "SELECT rollout_id, span_id, policy_version, prompt_token_ids FROM llm_calls"
            " WHERE group_id = 'g-new' AND dialect = 'gateway' ORDER BY rollout_id, start_time_unix_nano"
        )
        assert calls.select(whole_calls.columns).equals(whole_calls)
        assert calls.height == 6 and rollouts["rollout_id"].sort().to_list() == ["new-0", "new-1", "new-2"]
        assert sorted(rewards["rollout_id"]) == ["new-0", "new-1", "new-2"]


def test_a_store_made_before_the_identity_columns_gets_them_by_the_collectors_rule(tmp_path) -> None:
    db = tmp_path / "store.duckdb"
    identity = f"SELECT {', '.join(IDENTITY_COLUMNS)} FROM {{}} ORDER BY ALL"
    with Store(db) as store:
        ingest(store, "r-1", "g-1", time.time_ns())
        written = {table: store.query_arrow(identity.format(table)) for table in ("spans", "logs")}
    assert set(written["spans"]["rollout_id"].to_pylist()) == {"r-1"}
    assert set(written["logs"]["rollout_id"].to_pylist()) == {"r-1"}
    con = duckdb.connect(str(db))
    for table in ("spans", "logs", "metric_points"):
        for column in IDENTITY_COLUMNS:
            con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    con.execute("DROP SCHEMA normalized CASCADE")  # normalized by the earlier version's views
    con.execute("DELETE FROM view_sources")
    con.close()

    with Store(db) as store:
        assert {table: store.query_arrow(identity.format(table)) for table in written} == written
        store.wait_normalized(timeout_s=60)
        rollouts = store.query_arrow("SELECT rollout_id, group_id, n_calls FROM rollouts").to_pylist()
        assert rollouts == [{"rollout_id": "r-1", "group_id": "g-1", "n_calls": 2}]
    assert differences(db) == {name: (0, 0) for name in NORMALIZED}
