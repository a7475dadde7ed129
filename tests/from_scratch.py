"""The views computed from scratch over raw rows (as the store computed them at query time before it
maintained them), to hold the store's maintained tables against."""

from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from otel_rl.store import archive
from otel_rl.store.connection import CATALOG, connect
from otel_rl.store.definitions import NORMALIZED, read_definitions
from otel_rl.store.layout import RAW_TABLES
from otel_rl.store.schema import default_transforms_dir


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    """Every view of transforms/*.sql, as a view, in `con`'s current database (its raw tables must exist)."""
    for file in read_definitions(default_transforms_dir()):
        for statement in file.statements:
            con.execute(statement.sql)


def differences(db: Path) -> dict[str, tuple[int, int]]:
    """Per normalized table: (rows the table lacks, rows it has too many) against its view computed from
    scratch over all the raw rows (archived ones included), as multisets. The store must be closed (or opened
    by nobody else)."""
    con = connect(db, read_only=True)
    try:
        files = archive.manifest(con)
        con.execute("USE memory")
        for layout in RAW_TABLES:
            rows = archive.raw_rows(db, files, layout.table, f"{CATALOG}.main.{layout.table}")
            con.execute(f"CREATE VIEW {layout.table} AS {rows}")
        create_views(con)
        found = {}
        for name in NORMALIZED:
            stored, scratch = f"{CATALOG}.main.{name}", f"memory.main.{name}"
            (missing,) = con.execute(
                f"SELECT count(*) FROM (FROM {scratch} EXCEPT ALL FROM {stored})"
            ).fetchone()
            (extra,) = con.execute(
                f"SELECT count(*) FROM (FROM {stored} EXCEPT ALL FROM {scratch})"
            ).fetchone()
            found[name] = (missing, extra)
        return found
    finally:
        con.close()


class ScratchViews:
    """The raw rows of a store (as read through any query function), in an in-memory DuckDB with the views
    computed from scratch over them: `query(sql)` answers as the store answered before it kept tables."""

    def __init__(self, raw: dict[str, pa.Table]) -> None:
        self._con = duckdb.connect()
        for name, rows in raw.items():
            self._con.register(f"{name}_rows", rows)
            self._con.execute(f"CREATE TABLE {name} AS FROM {name}_rows")
        create_views(self._con)

    def query(self, sql: str, params: list | dict | None = None) -> pl.DataFrame:
        return pl.from_arrow(self._con.sql(sql, params=params).to_arrow_table())
