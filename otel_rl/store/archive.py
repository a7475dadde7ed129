"""The store's archive, as read: raw rows moved out of the store file into Parquet files (archiver.py moves
them), listed by the store's `archive_files` table, and read together with the rows still in the store.

Beside a store `<folder>/<stem>.duckdb`, one file per raw table and day (UTC) of receipt, and per archive run:

    <folder>/<stem>.archive/<raw_table>/day=YYYY-MM-DD/<name>.parquet

A file is written under a temporary name (`<name>.parquet.tmp`), listed in `archive_files` by the transaction
that deletes its rows from the store, then renamed. Readers read exactly the files listed (never a glob of
the folder) in the snapshot they read the store in: each row is read once, from the store before that
commit, from its file after it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import duckdb

from otel_rl.store.connection import CATALOG, quoted
from otel_rl.store.layout import ARCHIVE_FILES, RAW_TABLES

MANIFEST = ARCHIVE_FILES.table
ARCHIVED_TABLES = tuple(layout.table for layout in RAW_TABLES)
TEMPORARY = ".tmp"  # the suffix of a file written and not yet listed, or listed and not yet renamed


@dataclass(frozen=True)
class ArchivedFile:
    """One row of `archive_files`."""

    path: str  # relative to the store's folder
    raw_table: str
    day: date
    rows: int
    bytes: int
    min_commit_seq: int | None
    max_commit_seq: int | None

    def holds_any(self, commits: Sequence[int]) -> bool:
        """Whether the file's commit range meets the sorted `commits` (a range or a list)."""
        if self.min_commit_seq is None or self.max_commit_seq is None:
            return False
        at = bisect_left(commits, self.min_commit_seq)
        return at < len(commits) and commits[at] <= self.max_commit_seq


def archive_dir(store_path: Path) -> Path:
    """The folder of a store's archive: `<stem>.archive` beside the store file (as an absolute path: the
    sandbox's allowed folders are compared with the paths read)."""
    store_path = store_path.resolve()
    return store_path.with_name(store_path.stem + ".archive")


def temporary_path(path: Path) -> Path:
    return path.with_name(path.name + TEMPORARY)


def store_file(con: duckdb.DuckDBPyConnection, catalog: str = CATALOG) -> Path:
    """The file of the store attached as `catalog`."""
    (path,) = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = ?", [catalog]).fetchone()
    return Path(path)


def manifest(con: duckdb.DuckDBPyConnection, catalog: str = CATALOG) -> list[ArchivedFile]:
    """The files of the store attached as `catalog` (none for a store made before the archive existed, opened
    read-only: not brought up to date)."""
    (exists,) = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main'"
        " AND table_name = ?",
        [catalog, MANIFEST],
    ).fetchone()
    return listed_files(con, catalog) if exists else []


def listed_files(con: duckdb.DuckDBPyConnection, catalog: str = CATALOG) -> list[ArchivedFile]:
    """The files of a store whose `archive_files` exists (one a Store opened): half what `manifest` costs,
    which counts at every query."""
    rows = con.execute(
        "SELECT path, raw_table, day, rows, bytes, min_commit_seq, max_commit_seq"
        f" FROM {catalog}.main.{MANIFEST} ORDER BY day, raw_table, path"
    ).fetchall()
    return [ArchivedFile(*row) for row in rows]


def readable_path(store_path: Path, file: ArchivedFile) -> Path:
    """Where a listed file is: its name, or its temporary name while only that exists (the commit that listed
    it is done and the rename is not, or it was interrupted: the store's next open renames it)."""
    path = store_path.resolve().parent / file.path
    temporary = temporary_path(path)
    return temporary if not path.exists() and temporary.exists() else path


def with_archived(source: str, paths: Sequence[Path]) -> str:
    """A SELECT of the rows of `source` (a raw table of a store) and of the archived files `paths`."""
    if not paths:
        return f"SELECT * FROM {source}"
    files = ", ".join(quoted(path) for path in paths)
    # hive_partitioning off: the day=... folders must not add a column the store's tables lack
    archived = f"read_parquet([{files}], hive_partitioning = false)"
    return f"SELECT * FROM {source} UNION ALL BY NAME SELECT * FROM {archived}"


def raw_rows(
    store_path: Path,
    files: Sequence[ArchivedFile],
    table: str,
    source: str,
    commits: Sequence[int] | None = None,
) -> str:
    """A SELECT of the raw table's rows in the store (`source`) and in its archived files: every file of the
    table, or only those whose commit range meets the sorted `commits` when given."""
    paths = [
        readable_path(store_path, file)
        for file in files
        if file.raw_table == table and (commits is None or file.holds_any(commits))
    ]
    return with_archived(source, paths)


class RawRows:
    """The store's raw rows, in its tables and in its archive, as listed in the caller's transaction."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._store = store_file(con)
        self._files = listed_files(con)

    def rows(self, table: str, commits: Sequence[int]) -> str:
        """A SELECT of the table's rows, with those of the archived files whose commits meet the sorted
        `commits`."""
        select = raw_rows(self._store, self._files, table, f"{CATALOG}.main.{table}", commits)
        return f"SELECT * FROM ({select})"


def shadow_raw_tables(
    cursor: duckdb.DuckDBPyConnection, store_path: Path, files: Sequence[ArchivedFile]
) -> None:
    """Make the raw tables read their archived rows too, on this cursor only: a temporary view named after
    each raw table with archived files shadows the table, in user SQL and inside the store's views alike."""
    for table in sorted({file.raw_table for file in files}):
        source = f"{CATALOG}.main.{table}"
        cursor.execute(f"CREATE TEMP VIEW {table} AS {raw_rows(store_path, files, table, source)}")


def allow_reading(con: duckdb.DuckDBPyConnection, store_paths: Sequence[Path]) -> None:
    """Let the DuckDB instance of `con` reach the stores' archive folders (and nothing else: see sandbox.py)
    and cache Parquet footers; before lock_down, which locks these settings."""
    folders = ", ".join(quoted(f"{archive_dir(path)}/") for path in store_paths)
    con.execute(f"SET allowed_directories = [{folders}]")
    con.execute("SET parquet_metadata_cache = true")
