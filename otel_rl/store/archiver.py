"""Moving raw rows out of the store into its archive (archive.py says how it is laid out and read), exactly
once and safe against a crash at any point.

An archive run, on a cursor of the store, in one transaction (one snapshot of the raw tables):
1. `write_files`: each raw table's rows of each day before the cutoff to a Parquet file (DuckDB's COPY, zstd)
   under its temporary name;
2. `record`: delete those rows from the store and list the files in `archive_files`;
3. COMMIT, then `publish`: rename each file to its name.
Rows the writer commits meanwhile are not in the snapshot: neither written nor deleted. A crash before the
commit leaves unlisted temporary files; after it, listed files still under their temporary name (which
readers read as they are). `finish_interrupted`, at the store's next open, renames the latter and deletes
every file the manifest does not list (the former, and those a retention run stopped before deleting).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa

from otel_rl.store.archive import (
    ARCHIVED_TABLES,
    MANIFEST,
    TEMPORARY,
    ArchivedFile,
    archive_dir,
    manifest,
    temporary_path,
)
from otel_rl.store.connection import quoted
from otel_rl.store.layout import RECEIVED_AT
from otel_rl.store.schema import COMMIT_NUMBERED

log = logging.getLogger(__name__)

EPOCH = date(1970, 1, 1)
DAY_OF_RECEIPT = "epoch_us(received_at) // 86400000000"  # the UTC day, as days since the epoch
# The order rows are written in: the normalizer reads archived rows by commit, and skips row groups by their
# commit_seq min/max.
WRITE_ORDER = {"spans": "commit_seq", "call_tokens": "commit_seq", "logs": "commit_seq"}


class ArchiveError(RuntimeError):
    """An archive run could not be done as asked (the message says why); nothing of it was committed."""


def midnight(day: date) -> datetime:
    """The start of `day`, UTC."""
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def received_on(day: date) -> str:
    """The SQL predicate: received on `day` (UTC)."""
    start, end = midnight(day), midnight(day + timedelta(days=1))
    return (
        f"received_at >= TIMESTAMPTZ '{start.isoformat()}' AND received_at < TIMESTAMPTZ '{end.isoformat()}'"
    )


def archive_rows(
    con: duckdb.DuckDBPyConnection, store_path: Path, before: date, *, publishing: threading.Lock
) -> list[ArchivedFile]:
    """Move the raw rows received before `before` (UTC) into the archive; the files written.

    `publishing` is held from the commit to the end of the renames: readers hold it while they read the
    manifest, so that a file they see listed has its name (archive.readable_path covers the others).
    """
    archived_at = datetime.now(UTC)
    con.execute("BEGIN TRANSACTION")
    files: list[ArchivedFile] = []
    try:
        files = write_files(con, store_path, before, archived_at)
        record(con, files, before, archived_at)
    except BaseException:
        con.execute("ROLLBACK")
        discard(store_path, files)
        raise
    with publishing:
        # A failed COMMIT may still have committed: the files stay, and the next open keeps or deletes each
        # as the manifest says.
        con.execute("COMMIT")
        publish(store_path, files)
    return files


def write_files(
    con: duckdb.DuckDBPyConnection, store_path: Path, before: date, archived_at: datetime
) -> list[ArchivedFile]:
    """In the caller's transaction: one file per raw table and day of the rows received before `before`,
    each under its temporary name."""
    files: list[ArchivedFile] = []
    try:
        for table in ARCHIVED_TABLES:
            days = con.execute(
                f"SELECT DISTINCT {DAY_OF_RECEIPT} FROM {table} WHERE received_at < ? ORDER BY 1",
                [midnight(before)],
            ).fetchall()
            for (day_number,) in days:
                files.append(
                    _write_day(con, store_path, table, EPOCH + timedelta(days=day_number), archived_at)
                )
    except BaseException:
        discard(store_path, files)
        raise
    return files


def _write_day(
    con: duckdb.DuckDBPyConnection, store_path: Path, table: str, day: date, archived_at: datetime
) -> ArchivedFile:
    folder = archive_dir(store_path)
    name = f"{archived_at:%Y%m%dT%H%M%S}-{secrets.token_hex(4)}.parquet"
    path = folder / table / f"day={day.isoformat()}" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    rows_of_day = f"FROM {table} WHERE {received_on(day)}"
    order = f" ORDER BY {WRITE_ORDER[table]}" if table in WRITE_ORDER else ""
    (rows,) = con.execute(
        f"COPY (SELECT * {rows_of_day}{order}) TO {quoted(temporary)} (FORMAT parquet, COMPRESSION zstd)"
    ).fetchone()
    low = high = None
    if table in COMMIT_NUMBERED:
        low, high = con.execute(f"SELECT min(commit_seq), max(commit_seq) {rows_of_day}").fetchone()
    relative = path.relative_to(store_path.resolve().parent).as_posix()
    return ArchivedFile(relative, table, day, int(rows), temporary.stat().st_size, low, high)


def record(
    con: duckdb.DuckDBPyConnection, files: Sequence[ArchivedFile], before: date, archived_at: datetime
) -> None:
    """In the caller's transaction: delete the rows `files` hold from the store, and list the files."""
    for table in ARCHIVED_TABLES:
        (deleted,) = con.execute(f"DELETE FROM {table} WHERE received_at < ?", [midnight(before)]).fetchone()
        written = sum(file.rows for file in files if file.raw_table == table)
        if deleted != written:  # the same snapshot wrote them: a difference is a bug, and must not commit
            raise ArchiveError(
                f"{table}: {written} rows archived but {deleted} deleted; nothing was archived"
            )
    listed = pa.table(
        {
            "path": [file.path for file in files],
            "raw_table": [file.raw_table for file in files],
            "day": pa.array([file.day for file in files], pa.date32()),
            "rows": pa.array([file.rows for file in files], pa.uint64()),
            "bytes": pa.array([file.bytes for file in files], pa.uint64()),
            "min_commit_seq": pa.array([file.min_commit_seq for file in files], pa.uint64()),
            "max_commit_seq": pa.array([file.max_commit_seq for file in files], pa.uint64()),
            "archived_at": pa.array([archived_at] * len(files), RECEIVED_AT),
        }
    )
    con.register("listed_files", listed)
    try:
        con.execute(f"INSERT INTO {MANIFEST} BY NAME SELECT * FROM listed_files")
    finally:
        con.unregister("listed_files")


def publish(store_path: Path, files: Sequence[ArchivedFile]) -> None:
    """Rename each listed file from its temporary name, durably."""
    folders = set()
    for file in files:
        path = store_path.resolve().parent / file.path
        os.replace(temporary_path(path), path)
        folders.add(path.parent)
    for folder in folders:
        _sync(folder)


def discard(store_path: Path, files: Sequence[ArchivedFile]) -> None:
    """Delete the temporary files of a run that did not commit."""
    for file in files:
        temporary_path(store_path.resolve().parent / file.path).unlink(missing_ok=True)


def finish_interrupted(con: duckdb.DuckDBPyConnection, store_path: Path) -> tuple[int, int]:
    """At the store's open: rename the listed files left under their temporary name, and delete the files the
    manifest does not list. (renamed, deleted)."""
    folder = archive_dir(store_path)
    if not folder.is_dir():
        return 0, 0
    listed = {store_path.resolve().parent / file.path for file in manifest(con)}
    renamed = deleted = 0
    for table in ARCHIVED_TABLES:
        for path in sorted((folder / table).glob("day=*/*.parquet*")):
            final = path.with_name(path.name.removesuffix(TEMPORARY))
            if path.name.endswith(TEMPORARY) and final in listed and not final.exists():
                os.replace(path, final)
                _sync(final.parent)
                renamed += 1
            elif final not in listed or path != final:
                path.unlink()
                deleted += 1
    for missing in sorted(path for path in listed if not path.exists()):
        log.error(
            "the archive lacks %s, which the store lists: queries of its table fail until it is back", missing
        )
    remove_empty_folders(folder)
    if renamed or deleted:
        log.warning("an interrupted archive run was finished: %d files renamed, %d deleted", renamed, deleted)
    return renamed, deleted


def remove_empty_folders(folder: Path) -> None:
    """Remove the day folders that hold no file any more."""
    for table in ARCHIVED_TABLES:
        for day in (folder / table).glob("day=*"):
            if day.is_dir() and not any(day.iterdir()):
                day.rmdir()


def _sync(folder: Path) -> None:
    """fsync a folder: a rename in it is durable once this returns."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
