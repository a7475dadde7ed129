"""`otel-rl store check` and `otel-rl store recover`: what of a stopped server's store is readable, and
salvaging a store whose WAL is damaged."""

import os
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from otel_rl.store import wal
from otel_rl.store.connection import CATALOG, connect
from otel_rl.store.normalize import STATE, read_state
from otel_rl.store.schema import default_transforms_dir, last_commit


@dataclass
class CheckReport:
    """What `check_store` found; `damaged` is True when anything acknowledged is, or would be, lost."""

    db: Path
    lines: list[str] = field(default_factory=list)
    damaged: bool = False
    in_use: bool = False  # another process (a running server) holds the file: nothing was checked
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows (the WAL replayed)
    views: dict[str, str | None] = field(default_factory=dict)  # transforms file -> error or None

    def problem(self, line: str) -> None:
        self.damaged = True
        self.lines.append(f"DAMAGE: {line}")


def check_store(db: Path, *, transforms_dir: Path | None = None) -> CheckReport:
    """Open the store read-only (DuckDB replays the WAL in memory and changes no file) and report: the
    file opens, the WAL's state, every table's rows, and whether every view of `transforms_dir` binds."""
    report = CheckReport(db)
    if not db.is_file():
        report.problem(f"there is no store file at {db}")
        return report
    con, open_error = None, None
    try:
        con = _open_read_only(db)
    except duckdb.Error as exc:
        if _in_use(exc):
            report.in_use = True
            report.lines.append(f"the store is in use ({exc}): stop the server, then check again")
            return report
        open_error = exc
    report.lines.append(f"store file {db}: {db.stat().st_size} bytes")
    state = wal.read_wal(db)
    if state is None:
        report.lines.append("no WAL: the store was closed cleanly (everything is in the file)")
    elif state.dropped:
        report.problem(state.describe())
    else:
        report.lines.append(state.describe())
    if open_error is not None:
        if wal.is_replay_error(open_error):
            report.problem(wal.damaged_store_message(db, open_error))
        else:
            report.problem(f"the store file does not open: {open_error}")
        return report
    assert con is not None
    if state is not None:
        report.lines.append("the WAL replays (checked in memory; the files are unchanged)")
    with con:
        report.rows = _row_counts(con)
        report.lines.extend(f"table {name}: {rows} rows" for name, rows in report.rows.items())
        report.lines.extend(_normalized_state(con))
        report.views = _views_bind(con, transforms_dir or default_transforms_dir())
    for file, error in report.views.items():
        if error:
            report.problem(f"the views of {file} cannot be created: {error}")
        else:
            report.lines.append(f"views of {file}: ok")
    return report


def _in_use(exc: duckdb.Error) -> bool:
    return "Could not set lock on file" in str(exc)


def _open_read_only(db: Path) -> duckdb.DuckDBPyConnection:
    # The store attached read-only beside the in-memory default database: the views are created there,
    # binding to the store's tables through the search path, and nothing is written to the file.
    con = connect(db, read_only=True)
    con.execute("USE memory")
    con.execute(f"SET search_path = 'memory.main,{CATALOG}.main'")
    return con


def _row_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Rows of every table: the main schema's by name, the normalized tables' as normalized.<name>."""
    tables = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? ORDER BY 1 DESC, 2",
        [CATALOG],
    ).fetchall()
    return {
        (name if schema == "main" else f"{schema}.{name}"): con.execute(
            f'SELECT count(*) FROM {CATALOG}."{schema}"."{name}"'
        ).fetchone()[0]
        for schema, name in tables
    }


def _normalized_state(con: duckdb.DuckDBPyConnection) -> list[str]:
    """How far the normalized tables are, and the commits they skipped (their rows are in the raw tables)."""
    try:
        through, _ = read_state(con)
        skipped = con.execute(f"SELECT commit_seq, error FROM {STATE}.skipped ORDER BY 1").fetchall()
        last = last_commit(con)
    except duckdb.CatalogException:
        return ["no normalized tables yet: the server makes them when it next opens the store"]
    behind = (
        f", {last - through} behind: the server catches up when it next opens it" if last > through else ""
    )
    lines = [f"normalized tables: through commit {through} of {last}{behind}"]
    lines += [
        f"skipped commit {commit} (its rows are in the raw tables only): {error}" for commit, error in skipped
    ]
    return lines


def _views_bind(con: duckdb.DuckDBPyConnection, transforms_dir: Path) -> dict[str, str | None]:
    outcome: dict[str, str | None] = {}
    for file in sorted(transforms_dir.glob("*.sql")):
        try:
            con.execute(file.read_text())  # DuckDB binds a view when it is created
            outcome[file.name] = None
        except duckdb.Error as exc:
            outcome[file.name] = str(exc)
    return outcome


@dataclass
class RecoverReport:
    """What `recover_store` did: the copies it kept, the WAL bytes replayed and dropped, rows gained."""

    lines: list[str] = field(default_factory=list)
    recovered: bool = False  # the store opens now (it may have lost the WAL's damaged part)


def recover_store(db: Path) -> RecoverReport:
    """Salvage a store whose WAL stops it from opening or replays only part of it.

    Copies of the file and the WAL are kept beside them (`<name>.<UTC time>.damaged`); the WAL is cut
    before its first damaged entry (DuckDB then replays every commit before it, and drops the rest) and the
    store opened and checkpointed. The server must be stopped (DuckDB's file lock says so otherwise).
    """
    report = RecoverReport()
    state = wal.read_wal(db)
    if not db.is_file():
        report.lines.append(f"there is no store file at {db}: nothing to recover")
        return report
    cut = state.replayable if state is not None else 0
    try:
        _open_read_only(db).close()
    except duckdb.Error as exc:
        if _in_use(exc):
            report.lines.append(f"the store is in use ({exc}): stop the server, then recover")
            return report
        if not wal.is_replay_error(exc):
            report.lines.append(f"the store does not open, and not because of its WAL: {exc}")
            return report
        at = wal.damaged_at(exc)
        starts = wal.entry_starts(state.path) if state is not None and at is not None else None
        cut = max((start for start in starts if start <= at), default=0) if starts else 0
    else:
        if state is None or not state.dropped:
            report.lines.append("the store opens and its WAL (if any) replays whole: nothing to recover")
            report.recovered = True
            return report
    assert state is not None  # a damaged WAL exists, or the read-only open would have worked
    db_copy = wal.keep_copy(db, "damaged")
    wal_copy = wal.keep_copy(state.path, "damaged")
    report.lines.append(f"kept copies of the damaged store: {db_copy} and {wal_copy}")
    before = _rows_in(db_copy)  # the copy has no WAL beside it: the rows of the last checkpoint
    if cut:
        os.truncate(state.path, cut)
    else:
        state.path.unlink()
    con = connect(db)
    con.execute("CHECKPOINT")  # fold the salvaged commits into the file
    con.close()
    after = _rows_in(db)
    report.lines.append(
        f"replayed the WAL's first {cut} bytes of {state.size}; dropped the last {state.size - cut} bytes "
        f"(their commits are lost unless rebuilt from {wal_copy})"
    )
    report.lines.extend(
        f"table {name}: {rows} rows ({rows - before.get(name, 0)} of them from the WAL)"
        for name, rows in after.items()
    )
    report.recovered = True
    return report


def _rows_in(db: Path) -> dict[str, int]:
    with _open_read_only(db) as con:
        return _row_counts(con)
