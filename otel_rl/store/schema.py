"""A store's schema, created or brought up to date when it opens: the raw tables (from their layouts), the
store's own tables, the normalized tables and the views of the transforms files."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from otel_rl.store import normalize
from otel_rl.store.definitions import SqlFile, defined_normalized, normalized_fingerprint, read_definitions
from otel_rl.store.detections import create_detections
from otel_rl.store.identity import IDENTIFIED_TABLES, fill_identity_columns
from otel_rl.store.layout import ARCHIVE_FILES, KEY_TABLES, RAW_TABLES, TASK_TABLES

log = logging.getLogger(__name__)

COMMIT_NUMBERED = tuple(layout.table for layout in (*RAW_TABLES, *TASK_TABLES) if layout.commit_numbered)
LEGACY_COMMIT_ROWS = 16_384  # rows stored before commits were numbered: numbered this many to a commit
_VIEW_SOURCES_SQL = """
CREATE TABLE IF NOT EXISTS view_sources (   -- the transforms/*.sql files whose views are in place
    position    INTEGER NOT NULL,
    file        VARCHAR NOT NULL,
    sha256      VARCHAR NOT NULL
);
"""


@dataclass
class Schema:
    """What opening did: each transforms file's error (None when its views were created), and the scratch
    database's fill statements when it was built (normalize.build_scratch)."""

    files: list[SqlFile]
    views: dict[str, str | None] = field(default_factory=dict)
    fills: dict[str, str] | None = None
    fingerprint: str = ""
    through: int = 0


def default_transforms_dir() -> Path:
    """The view SQL: `transforms/` of a checkout, or its copy inside an installed wheel."""
    checkout = Path(__file__).resolve().parents[2] / "transforms"
    return checkout if checkout.is_dir() else Path(__file__).resolve().parents[1] / "_sql"


def create_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Every table where missing, and the columns an older store lacks (with their values)."""
    existing = {
        (table, column)
        for table, column in con.execute(
            "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = current_database()"
            " AND schema_name = 'main'"
        ).fetchall()
    }
    tables = {table for table, _ in existing}
    for layout in (*RAW_TABLES, *KEY_TABLES, *TASK_TABLES, ARCHIVE_FILES):
        if layout.table not in tables:
            con.execute(layout.ddl())  # with its comments, written once
            continue
        missing = [column for column in layout.columns if (layout.table, column.name) not in existing]
        if missing:
            con.execute(layout.add_missing_columns())
            _fill_added_columns(con, layout.table, {column.name for column in missing})
    con.execute(_VIEW_SOURCES_SQL)
    con.execute(normalize.STATE_SQL)


def _fill_added_columns(con: duckdb.DuckDBPyConnection, table: str, added: set[str]) -> None:
    """Values for the columns added to an older store's rows."""
    if table in IDENTIFIED_TABLES and "rollout_id" in added:
        fill_identity_columns(con, table)
    if table == "call_tokens" and "received_at" in added:
        con.execute(
            "UPDATE call_tokens SET received_at = s.received_at FROM spans s"
            " WHERE s.trace_id = call_tokens.trace_id AND s.span_id = call_tokens.span_id"
        )
    if "commit_seq" not in added:
        return
    log.warning("numbering the commits of %s's rows stored before commits were numbered", table)
    if table == "call_tokens":  # as its span's: a call's tokens are normalized with its span
        con.execute(
            "UPDATE call_tokens SET commit_seq = s.commit_seq FROM spans s"
            " WHERE s.trace_id = call_tokens.trace_id AND s.span_id = call_tokens.span_id"
        )
    else:
        con.execute(f"UPDATE {table} SET commit_seq = rowid // {LEGACY_COMMIT_ROWS} + 1")


def last_commit(con: duckdb.DuckDBPyConnection) -> int:
    """The store's last commit that wrote raw rows, archived ones included (0 for none)."""
    parts = " UNION ALL ".join(f"SELECT max(commit_seq) AS c FROM {table}" for table in COMMIT_NUMBERED)
    parts += f" UNION ALL SELECT max(max_commit_seq) AS c FROM {ARCHIVE_FILES.table}"
    (last,) = con.execute(f"SELECT coalesce(max(c), 0) FROM ({parts})").fetchone()
    return int(last)


def create_views(con: duckdb.DuckDBPyConnection, transforms_dir: Path) -> Schema:
    """(Re)create the views of each `*.sql` file in `transforms_dir` in file-name order, the normalized
    ones (definitions.NORMALIZED) as tables the normalizer maintains.

    Files are run from the first one that changed (or failed) since the last open: binding the views takes
    seconds, and restarts should not. When what the normalized tables depend on changed (or the store is
    new), they are emptied and normalized again from the first commit. A broken view file is logged, not
    fatal: ingest does not depend on views, and the store must keep taking data while someone fixes the SQL.
    """
    files = read_definitions(transforms_dir)
    sources = [(file.name, file.sha256) for file in files]
    created = con.execute("SELECT file, sha256 FROM view_sources ORDER BY position").fetchall()
    unchanged = 0
    while unchanged < min(len(sources), len(created)) and sources[unchanged] == tuple(created[unchanged]):
        unchanged += 1
    fingerprint = normalized_fingerprint(files)
    through, stored = normalize.read_state(con)
    rebuild = stored != fingerprint or not _normalized_tables_exist(con, defined_normalized(files))
    views = {name: None for name, _ in sources[:unchanged]}
    schema = Schema(files, views, fingerprint=fingerprint, through=through)
    if unchanged == len(files) == len(created) and not rebuild:
        return schema
    fills, scratch_errors = normalize.build_scratch(con, files)
    defined = defined_normalized(files)
    schema.fills = fills if all(name in fills for name in defined) else None  # else the normalizer says why
    if rebuild:
        if scratch_errors:  # the normalized tables cannot be shaped: kept as they are until the SQL is fixed
            log.error("the normalized tables are not rebuilt while the views fail: %s", scratch_errors)
        else:
            if stored is not None:  # a new store has nothing to normalize again
                log.warning("normalizing the store again from its first commit (the views changed)")
            normalize.create_normalized_tables(con, defined, rebuild=True)
            normalize.write_state(con, 0, fingerprint)
            schema.through, unchanged = 0, 0
    for file in files[unchanged:]:
        schema.views[file.name] = _run_file(con, file)
    create_detections(con)  # after every file: the union of the detect_* views any of them defined
    _record_sources(con, sources, created, schema.views)
    return schema


def _normalized_tables_exist(con: duckdb.DuckDBPyConnection, names: list[str]) -> bool:
    tables = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
        " AND schema_name = 'normalized'"
    ).fetchall()
    return set(names) <= {name for (name,) in tables}


def _run_file(con: duckdb.DuckDBPyConnection, file: SqlFile) -> str | None:
    """Run one file's statements in the store, the normalized views as views of their tables; its error."""
    try:
        for statement in file.statements:
            con.execute(normalize.public_view_sql(statement.view) if statement.normalized else statement.sql)
    except duckdb.Error as exc:
        log.error("views of %s were not created: %s", file.name, exc)
        return str(exc)
    return None


def _record_sources(
    con: duckdb.DuckDBPyConnection,
    sources: list[tuple[str, str]],
    created: list[tuple],
    outcome: dict[str, str | None],
) -> None:
    """Remember the files in place, up to the first that failed: the next open starts there."""
    first_failed = next((i for i, (name, _) in enumerate(sources) if outcome.get(name)), len(sources))
    if [tuple(row) for row in created] == sources[:first_failed]:
        return  # nothing to record: a reopen on a full disk must not need to write
    in_place = pa.table(
        {
            "position": pa.array(range(first_failed), pa.int32()),
            "file": [name for name, _ in sources[:first_failed]],
            "sha256": [digest for _, digest in sources[:first_failed]],
        }
    )
    con.execute("BEGIN TRANSACTION")
    con.execute("DELETE FROM view_sources")
    con.register("in_place", in_place)
    con.execute("INSERT INTO view_sources SELECT * FROM in_place")
    con.unregister("in_place")
    con.execute("COMMIT")
