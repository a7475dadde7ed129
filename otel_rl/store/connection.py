"""Opening a store file: always under one catalog name, whatever the file is called."""

import os
from pathlib import Path

import duckdb

DEFAULT_DB = Path(".otel_rl") / "otel_rl.duckdb"

# DuckDB names a database after its file's stem, and a catalog name shadows table aliases of the same name:
# in a file called `t.duckdb`, the views' `t.message` is ambiguous and their creation fails. Attached under a
# fixed name, every file name works.
CATALOG = "otel_rl_store"


def default_db() -> Path:
    """The store file a command opens when it names none: OTEL_RL_DB, else DEFAULT_DB."""
    return Path(os.environ.get("OTEL_RL_DB") or DEFAULT_DB)


def connect(path: str | Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A connection whose default database is the store file at `path` (created unless `read_only`).

    One DuckDB thread: the server's own threads (OTLP decoding, the gateway) keep the cores busy, and a
    second one made each ingested span cost 25% more CPU.
    """
    con = duckdb.connect(config={"threads": 1})
    mode = " (READ_ONLY)" if read_only else ""
    try:
        con.execute(f"ATTACH {quoted(path)} AS {CATALOG}{mode}")
    except duckdb.Error:
        con.close()
        raise
    con.execute(f"USE {CATALOG}")
    return con


def cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A new connection to the same store for another thread (a DuckDB cursor starts in the in-memory
    database, not in the one its parent USEs)."""
    child = con.cursor()
    child.execute(f"USE {CATALOG}")
    return child


def quoted(value: object) -> str:
    """A SQL string literal, only where DuckDB binds no parameter (ATTACH, COPY ... TO, SET, a view's
    definition): the store's and the archive's paths and a day's bound, never a record's value or id."""
    return "'" + str(value).replace("'", "''") + "'"
