"""The store's views over a window of time: the raw rows since then, copied into an in-memory DuckDB that has
the same tables and views.

A training step reads the calls and rewards of its own rollouts, but the views work out identity, which
client span a gateway call supersedes and where a reward belongs over every stored span before a WHERE on
their output applies: read through the server, a step costs what the store holds (on a copy of a demo's
store, 0.3–0.6 s of CPU at 22.6K spans, 3.3–4.0 s with ten times that history). A step's rollouts all
started after a known time, and every row the views need for them (their traces, their gateway calls and
tokens, their rewards) started or arrived after it: the same views over just those rows answer the same
for those rollouts, at a cost that follows the window instead of the store.
"""

from collections.abc import Callable
from datetime import UTC, datetime

import duckdb
import polars as pl

from otel_rl.query import sql_list
from otel_rl.store.store import create_tables_and_views, default_transforms_dir

# Raw tables a window copies: spans and logs by time; the calls' tokens (no time of their own) by trace.
WINDOW_TABLES = ("spans", "call_tokens", "logs")


class StoreWindow:
    """`load(run_query, since_ns)` copies the store's rows since then; `query(sql)` runs over the copy."""

    def __init__(self) -> None:
        self._con = duckdb.connect(config={"threads": 1})
        # once: binding the views takes seconds; loads then only replace rows
        create_tables_and_views(self._con, default_transforms_dir())

    def load(self, run_query: Callable[[str], pl.DataFrame], since_ns: int) -> None:
        """Replace the copy with the store's spans and logs from `since_ns` on and their traces' tokens.

        `run_query` runs one read-only statement over the store (the server's /v1/query). A span started
        before `since_ns` is left out even when its trace is in the window: a window must start before
        everything the rollouts read does.
        """
        spans = run_query(f"SELECT * FROM spans WHERE start_time_unix_nano >= {since_ns}")
        traces = spans["trace_id"].unique().to_list()
        # Rows about the window's rollouts arrived after they started: bounding received_at (which grows as
        # rows are appended) lets DuckDB skip the row groups stored before, instead of testing every stored
        # row against the IN list and the log times. An IN list of literals is a filter DuckDB pushes into
        # the scan; a join would read every row.
        received = f"received_at >= '{datetime.fromtimestamp(since_ns / 1e9, UTC).isoformat()}'::TIMESTAMPTZ"
        tokens = f"SELECT * FROM call_tokens WHERE {received} AND trace_id IN {sql_list(traces)}"
        logs = (
            f"SELECT * FROM logs WHERE {received}"
            f" AND greatest(time_unix_nano, observed_time_unix_nano) >= {since_ns}"
        )
        rows = {"spans": spans, "call_tokens": run_query(tokens) if traces else None, "logs": run_query(logs)}
        con = self._con
        con.execute("BEGIN TRANSACTION")
        for table in WINDOW_TABLES:
            con.execute(f"DELETE FROM {table}")
            incoming = rows[table]  # noqa: F841 - read by DuckDB by its name
            if rows[table] is not None and rows[table].height:
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM incoming")
        con.execute("COMMIT")

    def query(self, sql: str) -> pl.DataFrame:
        """One statement over the window's rows."""
        return pl.from_arrow(self._con.sql(sql).to_arrow_table())
