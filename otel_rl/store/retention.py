"""What an archive run does (`otel-rl archive`, POST /v1/admin/archive, `otel-rl serve`'s hourly run), and
retention: deleting the archive's oldest days (and raw rows still in the store) by age or by size.

Deleted data must not survive in the normalized tables: in the transaction that deletes it, the names its
commits named are queued for the normalizer to recompute from what remains (normalize.forget).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa

from otel_rl.store import normalize
from otel_rl.store.archive import (
    ARCHIVED_TABLES,
    MANIFEST,
    ArchivedFile,
    archive_dir,
    manifest,
    readable_path,
    temporary_path,
)
from otel_rl.store.archiver import archive_rows, midnight, remove_empty_folders
from otel_rl.store.connection import quoted
from otel_rl.store.schema import COMMIT_NUMBERED

MAX_DAYS = 36_500  # a hundred years: a larger number of days is a typo
MAX_BYTES = 2**50  # 1 PiB
_SIZE = re.compile(r"^\s*(\d{1,20}(?:\.\d{1,9})?)\s*([KMGT]?)(I?)B?\s*$", re.I)


class PolicyError(ValueError):
    """An archive or retention setting that cannot be used (the message names it)."""


@dataclass(frozen=True)
class ArchivePolicy:
    """Archive the raw rows received before `before` (a day, UTC); then delete archived days received over
    `retain_days` days ago (and raw rows as old still in the store), then the oldest archived days while the
    archive's files are over `retain_bytes`. None: that step is not taken."""

    before: date | None = None
    retain_days: int | None = None
    retain_bytes: int | None = None

    def check(self, today: date) -> None:
        """PolicyError unless every step is possible and at least one is asked for.

        By hand, not a pydantic validator: `before`'s bound is the day it runs (a scheduled archive checks
        again each day), and `otel-rl archive` and ScheduleSettings' validator both call this one rule."""
        if self.before is None and self.retain_days is None and self.retain_bytes is None:
            raise PolicyError("nothing to do: give --before, --retain-days or --retain-bytes")
        if self.before is not None and not date(1970, 1, 2) <= self.before <= today:
            raise PolicyError(
                f"--before {self.before}: archive finished days, between 1970-01-02 and today ({today}, UTC)"
            )
        if self.retain_days is not None and not 0 <= self.retain_days <= MAX_DAYS:
            raise PolicyError(f"--retain-days {self.retain_days}: between 0 and {MAX_DAYS}")
        if self.retain_bytes is not None and not 1 <= self.retain_bytes <= MAX_BYTES:
            raise PolicyError(f"--retain-bytes {self.retain_bytes}: between 1 byte and {MAX_BYTES:,} (1 PiB)")


def parse_size(text: str) -> int:
    """Bytes of a size such as 500MB, 2GiB, 1.5T or 1000000 (K, M, G, T: powers of 1000; KiB...: of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise PolicyError(f"{text!r} is not a size: write e.g. 500MB, 20GiB or 1000000 (bytes)")
    number, unit, binary = match.groups()
    if binary and not unit:
        raise PolicyError(f"{text!r} is not a size: 'i' needs a unit (KiB, MiB, GiB, TiB)")
    scale = (1024 if binary else 1000) ** ("KMGT".index(unit.upper()) + 1) if unit else 1
    size = int(float(number) * scale)
    if not 1 <= size <= MAX_BYTES:
        raise PolicyError(f"{text!r}: a size between 1 byte and 1 PiB")
    return size


@dataclass
class Deleted:
    """What a retention run deleted: archived days and files, raw rows still in the store, and the names
    queued for the normalizer (an empty table when none)."""

    days: list[date]
    files: int
    bytes: int
    store_rows: int
    renormalize: pa.Table


@dataclass
class ArchiveReport:
    """What an archive run did: the files it wrote and what its retention deleted (None: not asked)."""

    archived: list[ArchivedFile] | None
    deleted: Deleted | None

    def lines(self) -> list[str]:
        """The run in a line per step, for people."""
        lines = []
        if self.archived is not None:
            rows: dict[str, int] = {}
            for file in self.archived:
                rows[file.raw_table] = rows.get(file.raw_table, 0) + file.rows
            moved = ", ".join(f"{n} {table} rows" for table, n in rows.items()) or "no rows"
            size = sum(file.bytes for file in self.archived)
            lines.append(f"archived {moved} into {len(self.archived)} files ({size:,} bytes)")
        if self.deleted is not None:
            deleted = self.deleted
            days = f" (days {deleted.days[0]} to {deleted.days[-1]})" if deleted.days else ""
            lines.append(
                f"deleted {deleted.files} archived files of {deleted.bytes:,} bytes{days} and"
                f" {deleted.store_rows} raw rows from the store; {deleted.renormalize.num_rows} traces,"
                " rollouts or sessions to normalize again"
            )
        return lines


def run(
    con: duckdb.DuckDBPyConnection,
    store_path: Path,
    policy: ArchivePolicy,
    today: date,
    *,
    publishing: threading.Lock,
) -> ArchiveReport:
    """One archive run on `con` (a cursor of the store): archive, then retention, each as `policy` asks."""
    archived = None
    if policy.before is not None:
        archived = archive_rows(con, store_path, policy.before, publishing=publishing)
    deleted = None
    if policy.retain_days is not None or policy.retain_bytes is not None:
        deleted = apply_retention(con, store_path, policy, today)
    return ArchiveReport(archived, deleted)


def expired_files(files: Sequence[ArchivedFile], policy: ArchivePolicy, today: date) -> list[ArchivedFile]:
    """The archived files retention deletes: whole days, the too old ones first, then the oldest while the
    rest is over the size."""
    too_old = policy.retain_days is not None
    expired = [file for file in files if too_old and file.day < _cutoff(policy, today)]
    if policy.retain_bytes is not None:
        kept = [file for file in files if file not in expired]
        size = sum(file.bytes for file in kept)
        for day in sorted({file.day for file in kept}):
            if size <= policy.retain_bytes:
                break
            of_day = [file for file in kept if file.day == day]
            expired += of_day
            size -= sum(file.bytes for file in of_day)
    return expired


def apply_retention(
    con: duckdb.DuckDBPyConnection, store_path: Path, policy: ArchivePolicy, today: date
) -> Deleted:
    """Delete what `policy` retains no more, in one transaction on `con` (a cursor of the store), then the
    files that transaction unlisted."""
    files = manifest(con)
    expired = expired_files(files, policy, today)
    old = "false" if policy.retain_days is None else f"received_at < {_timestamp(_cutoff(policy, today))}"
    con.execute("BEGIN TRANSACTION")
    try:
        deleted = _values(con, "commit_seq", _rows(COMMIT_NUMBERED, old, expired, store_path))
        touched = sorted(deleted)
        kept = [file for file in files if file not in expired and file.holds_any(touched)]
        remaining = _values(con, "commit_seq", _rows(COMMIT_NUMBERED, f"NOT ({old})", kept, store_path))
        log_seqs = _values(con, "seq", _rows(("logs",), old, expired, store_path))
        queued = normalize.forget(
            con,
            deleted=pa.table({"commit_seq": pa.array(touched, pa.uint64())}),
            gone=pa.table({"commit_seq": pa.array(sorted(deleted - remaining), pa.uint64())}),
            log_seqs=pa.table({"seq": pa.array(sorted(log_seqs), pa.uint64())}),
            requested_at=datetime.now(UTC),
        )
        store_rows = 0
        for table in ARCHIVED_TABLES:
            (rows,) = con.execute(f"DELETE FROM {table} WHERE {old}").fetchone()
            store_rows += rows
        if expired:
            unlisted = ", ".join(quoted(file.path) for file in expired)
            con.execute(f"DELETE FROM {MANIFEST} WHERE path IN ({unlisted})")
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.TransactionException):  # a failed COMMIT ended it already
            con.execute("ROLLBACK")
        raise
    folder = store_path.resolve().parent
    for file in expired:  # a crash before this is finished at the next open (archiver.finish_interrupted)
        (folder / file.path).unlink(missing_ok=True)
        temporary_path(folder / file.path).unlink(missing_ok=True)
    remove_empty_folders(archive_dir(store_path))
    days = sorted({file.day for file in expired})
    return Deleted(days, len(expired), sum(file.bytes for file in expired), store_rows, queued)


def _cutoff(policy: ArchivePolicy, today: date) -> date:
    """The first day retention keeps by age."""
    return today - timedelta(days=policy.retain_days or 0)


def _timestamp(day: date) -> str:
    return f"{quoted(midnight(day).isoformat())}::TIMESTAMPTZ"


def _rows(tables: Sequence[str], where: str, files: Sequence[ArchivedFile], store_path: Path) -> list[str]:
    """SELECTs of the rows of `tables` matching `where` in the store, and of every row of `files` of those
    tables."""
    selects = [f"SELECT * FROM {table} WHERE {where}" for table in tables]
    paths = [quoted(readable_path(store_path, file)) for file in files if file.raw_table in tables]
    if paths:
        selects.append(f"SELECT * FROM read_parquet([{', '.join(paths)}], hive_partitioning = false)")
    return selects


def _values(con: duckdb.DuckDBPyConnection, column: str, selects: Sequence[str]) -> set[int]:
    """The distinct non-NULL values of `column` over `selects`."""
    values: set[int] = set()
    for select in selects:
        rows = con.execute(f"SELECT DISTINCT {column} FROM ({select}) WHERE {column} IS NOT NULL").fetchall()
        values.update(value for (value,) in rows)
    return values
