"""The normalized tables, maintained as data arrives: the views' own SQL, run over each newly committed
stretch of raw rows and everything they may change, in a scratch database beside the store.

Every raw row carries the commit that wrote it (`commit_seq`). A round takes the commits since the last round
(the delta) and their scope: the traces, rollouts and coding-CLI sessions the delta's rows name, closed over
what stored rows name together (a rollout's traces, a trace's rollouts, a session's traces...). Each view's
rows for a trace depend only on raw rows of that closure (rollout identity is placed within a trace and a
rollout, calls are deduplicated within one, rewards and tool results are matched within one), so the views
computed over the scope's raw rows alone equal the views over the whole store for the scope's keys. The
round copies those rows into the scratch database (which holds the same views, the normalized ones as tables
filled in file order), then replaces the scope's rows of each normalized table in the store, in one
transaction with the watermark. Late data is handled by construction: a parent span, a log record or a reward
arriving after the rest re-normalizes its whole scope.

Costs follow the delta, not the store: raw rows are found by commit (DuckDB skips row groups by their
`commit_seq` min/max), through `normalized.keys` (one row per commit and trace, rollout or session named, read
once per step of closing the scope: once a round when nothing links it further), and a scope's old rows are
deleted from the commit they were last written at (`normalized_commit`) on.

Raw rows moved to the archive (archive.py) are read from their files, found by their commit range. Names whose
raw rows retention deleted are queued in `normalized.renormalize` (`forget`): the next round adds them to its
scope, so that their rows are recomputed from what remains.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

import duckdb
import pyarrow as pa

from otel_rl.store import archive
from otel_rl.store.connection import CATALOG
from otel_rl.store.definitions import NORMALIZED, SqlFile

log = logging.getLogger(__name__)

SCRATCH = "otel_rl_normalize"  # the in-memory database the rounds compute in
STORE = f"{CATALOG}.main"
STATE = f"{CATALOG}.normalized"
HIDDEN = "normalized_commit"  # the commit each normalized row was written at (not in the public views)
RAW = ("spans", "call_tokens", "logs")
ROUND_ROWS = 200_000  # raw rows a round takes at most from the delta (catching up runs several rounds)
MAX_CLOSURE_STEPS = 64  # scopes chain through shared names; a longer chain is an error, not a hang
SCOPE_TABLES = (
    ("trace_id", "scope_traces"),
    ("rollout_id", "scope_rollouts"),
    ("session_id", "scope_sessions"),
)
SCOPE_COLUMNS = tuple(column for column, _ in SCOPE_TABLES)
ROUND_TABLES = ("delta_keys", *(table for _, table in SCOPE_TABLES), "renormalizing")  # emptied by each round
STATE_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {STATE};
CREATE TABLE IF NOT EXISTS {STATE}.keys (    -- what each commit's rows name: how scopes are closed and found
    commit_seq UBIGINT NOT NULL,
    trace_id   VARCHAR,
    rollout_id VARCHAR,
    session_id VARCHAR
);
CREATE TABLE IF NOT EXISTS {STATE}.state (   -- one row: normalized through this commit, by these definitions
    through     UBIGINT NOT NULL,
    fingerprint VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS {STATE}.skipped ( -- commits whose rows the views could not normalize, and why
    commit_seq UBIGINT NOT NULL,
    error      VARCHAR NOT NULL,
    skipped_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS {STATE}.renormalize ( -- names of rows retention deleted: the next round's scope
    trace_id     VARCHAR,
    rollout_id   VARCHAR,
    session_id   VARCHAR,
    requested_at TIMESTAMPTZ NOT NULL
);
"""
RENORMALIZE = "normalized.renormalize"  # as the writer names it in a batch (store.py)
# The rollout a row names: its identity column, resolved at ingest (store/identity.py); and the coding-CLI
# session a log record belongs to (as harness_sessions reads it), a text test before any parse.
NAMED_ROLLOUT = "rollout_id"
SESSION = (
    "CASE WHEN contains(attributes::VARCHAR, '\"conversation.id\"')"
    " OR contains(attributes::VARCHAR, '\"session.id\"')"
    " THEN coalesce(attributes ->> 'conversation.id', attributes ->> 'session.id') END"
)


class NormalizeError(RuntimeError):
    """A round could not normalize its rows (the message says which commits and why)."""


@dataclass(frozen=True)
class Round:
    """One round's figures, for logs and metrics."""

    through: int
    commits: int
    rows: int
    scope_traces: int
    seconds: float


# ---------------------------------------------------------------- the scratch database


def build_scratch(
    con: duckdb.DuckDBPyConnection, files: list[SqlFile]
) -> tuple[dict[str, str], dict[str, str]]:
    """(Re)create the scratch database: the raw tables (empty), the scope tables, and every view of `files`,
    the normalized and computed-once ones (definitions.py) as tables. Returns their fill statements in file
    order, and each file's error (the rest of a file is skipped after a statement fails, as the store skips
    it)."""
    con.execute(f"DETACH DATABASE IF EXISTS {SCRATCH}")
    con.execute(f"ATTACH ':memory:' AS {SCRATCH}")
    con.execute(f"USE {SCRATCH}")
    try:
        for table in RAW:
            con.execute(f"CREATE TABLE {table} AS FROM {STORE}.{table} LIMIT 0")
        con.execute(
            "CREATE TABLE delta_keys (commit_seq UBIGINT, trace_id VARCHAR, rollout_id VARCHAR,"
            " session_id VARCHAR); CREATE TABLE scope_traces (trace_id VARCHAR);"
            " CREATE TABLE scope_rollouts (rollout_id VARCHAR);"
            " CREATE TABLE scope_sessions (session_id VARCHAR);"
            f" CREATE TABLE renormalizing AS FROM {STATE}.renormalize LIMIT 0;"
        )
        fills: dict[str, str] = {}
        errors: dict[str, str] = {}
        for file in files:
            try:
                for statement in file.statements:
                    if statement.filled:
                        definition = f"SELECT * FROM ({statement.definition})"
                        con.execute(f"CREATE TABLE {statement.view} AS {definition} LIMIT 0")
                        fills[statement.view] = f"INSERT INTO {statement.view} {definition}"
                    else:
                        con.execute(statement.sql)
            except duckdb.Error as exc:
                errors[file.name] = str(exc)
    finally:
        con.execute(f"USE {CATALOG}")
    return fills, errors


def create_normalized_tables(con: duckdb.DuckDBPyConnection, names: list[str], *, rebuild: bool) -> None:
    """The store's normalized tables `names`, shaped as the scratch's (plus `normalized_commit`); with
    `rebuild`, emptied with the keys and the watermark: the next rounds normalize every commit again."""
    if rebuild:
        for name in NORMALIZED:
            con.execute(f"DROP TABLE IF EXISTS {STATE}.{name}")
    for name in names:
        con.execute(
            f"CREATE TABLE IF NOT EXISTS {STATE}.{name} AS"
            f" SELECT *, 0::UBIGINT AS {HIDDEN} FROM {SCRATCH}.main.{name} LIMIT 0"
        )
    if rebuild:
        con.execute(
            f"DELETE FROM {STATE}.keys; DELETE FROM {STATE}.skipped; DELETE FROM {STATE}.state;"
            f" DELETE FROM {STATE}.renormalize"
        )


def public_view_sql(name: str) -> str:
    """The view users read a normalized table through (without the bookkeeping column)."""
    return f"CREATE OR REPLACE VIEW {name} AS SELECT * EXCLUDE ({HIDDEN}) FROM normalized.{name}"


def read_state(con: duckdb.DuckDBPyConnection) -> tuple[int, str | None]:
    """(normalized through, by which definitions' fingerprint); (0, None) before any round."""
    row = con.execute(f"SELECT through, fingerprint FROM {STATE}.state").fetchone()
    return (int(row[0]), row[1]) if row else (0, None)


def write_state(con: duckdb.DuckDBPyConnection, through: int, fingerprint: str) -> None:
    con.execute(f"DELETE FROM {STATE}.state")
    con.execute(f"INSERT INTO {STATE}.state VALUES (?, ?)", [through, fingerprint])


# ---------------------------------------------------------------- one round


def run_round(
    con: duckdb.DuckDBPyConnection,
    fills: dict[str, str],
    *,
    since: int,
    until: int,
    skipped: frozenset[int],
    fingerprint: str,
) -> Round:
    """Normalize the commits in (since, until] (but `skipped`) and their scopes; commit it with the watermark.

    `con` is a cursor of its own (the normalizer's thread); the scratch database is emptied first.
    """
    started = time.perf_counter()
    con.execute(f"USE {SCRATCH}")
    for table in (*RAW, *fills, *ROUND_TABLES):
        # Emptied by replacing, not by DELETE: deleted rows stay in an in-memory table's row groups, and every
        # later round scanned them again (a round's fixed cost grew with the rounds run).
        con.execute(f"CREATE OR REPLACE TABLE {table} AS FROM {table} LIMIT 0")
    # One snapshot of the store for every read: a row an archive run moves meanwhile is read once, from the
    # store or from its file.
    con.execute("BEGIN TRANSACTION")
    try:
        old, renormalizing = _read_scope(con, since, until, skipped)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    (rows,) = con.execute("SELECT (SELECT count(*) FROM spans) + (SELECT count(*) FROM logs)").fetchone()
    # Commits of other rows only (metric points, rollout keys: four in ten of an online run's) name no scope:
    # the views over empty tables would be empty, and binding their SQL is most of a round's cost.
    if rows or renormalizing:
        for fill in fills.values():
            con.execute(fill)
    # The scope's stored rows were written at or after the newest commit of their names; those of names whose
    # commits retention deleted may be anywhere.
    lower = 0 if renormalizing else _oldest_written(con) if old else None
    (traces,) = con.execute("SELECT count(*) FROM scope_traces").fetchone()
    con.execute("BEGIN TRANSACTION")
    try:
        for name in (name for name in fills if name in NORMALIZED):
            owned = NORMALIZED[name]
            if lower is not None:
                con.execute(f"DELETE FROM {STATE}.{name} WHERE {HIDDEN} >= {lower} AND ({owned})")
            new = _new_rows(name, owned, since)
            con.execute(f"INSERT INTO {STATE}.{name} SELECT *, {until} FROM {name} WHERE {new}")
        con.execute(f"INSERT INTO {STATE}.keys SELECT * FROM delta_keys")
        if renormalizing:  # the requests this round read (a later one may name the same names: it stays)
            same = " AND ".join(f"r.{c} IS NOT DISTINCT FROM s.{c}" for c in (*SCOPE_COLUMNS, "requested_at"))
            con.execute(f"DELETE FROM {STATE}.renormalize r USING renormalizing s WHERE {same}")
        write_state(con, until, fingerprint)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    finally:
        con.execute(f"USE {CATALOG}")
    commits = len({*range(since + 1, until + 1)} - skipped)
    return Round(until, commits, int(rows), int(traces), time.perf_counter() - started)


def _read_scope(
    con: duckdb.DuckDBPyConnection, since: int, until: int, skipped: frozenset[int]
) -> tuple[list[int], bool]:
    """Copy the delta's raw rows into the scratch tables, close its scope (with the names queued by retention)
    and copy the scope's rows of earlier commits. (those earlier commits, whether names were queued)."""
    raw = archive.RawRows(con)
    not_skipped = f" AND commit_seq NOT IN {_int_list(skipped)}" if skipped else ""
    delta = f"commit_seq > {since} AND commit_seq <= {until}{not_skipped}"
    for table in RAW:  # archived delta rows: when the store normalizes every commit again
        con.execute(
            f"INSERT INTO {table} BY NAME {raw.rows(table, range(since + 1, until + 1))} WHERE {delta}"
        )
    con.execute(
        f"INSERT INTO delta_keys SELECT DISTINCT commit_seq, trace_id, {NAMED_ROLLOUT}, NULL FROM spans"
        f" UNION SELECT DISTINCT commit_seq, trace_id, {NAMED_ROLLOUT}, {SESSION} FROM logs"
    )
    con.execute("DELETE FROM delta_keys WHERE trace_id IS NULL AND rollout_id IS NULL AND session_id IS NULL")
    (queued,) = con.execute(f"INSERT INTO renormalizing SELECT * FROM {STATE}.renormalize").fetchone()
    _close_scope(con)
    old = _old_commits(con, skipped)
    if old:
        _load_old_rows(con, raw, old)
    return old, queued > 0


def _new_rows(name: str, owned: str, since: int) -> str:
    """The scratch rows of a normalized table that the round writes: those its scope owns, and for `rewards`
    the records placed nowhere (no trace, no rollout), written once: when their log record is in the delta."""
    if name != "rewards":
        return owned
    delta_logs = f"SELECT seq FROM logs WHERE commit_seq > {since}"
    return f"({owned}) OR (trace_id IS NULL AND rollout_id IS NULL AND seq IN ({delta_logs}))"


def _close_scope(con: duckdb.DuckDBPyConnection) -> None:
    """Fill the scope tables with the delta's names and those queued by retention, then add what stored rows
    name together with them until nothing is added: a rollout's traces, a trace's rollouts and sessions, a
    session's traces and rollouts.

    Each step reads `normalized.keys` once, which grows with the run (one row per commit and name): the rows
    that name the scope so far go to the scratch table `scope_keys` (`stored`: of an earlier round, else of
    the delta), where the step's new names are found. When a step adds none, `scope_keys` holds every keys row
    of the scope, which the rest of the round reads instead of the store's."""
    names = ", ".join(SCOPE_COLUMNS)
    named = f"(SELECT {names} FROM delta_keys UNION ALL SELECT {names} FROM renormalizing)"
    for column, table in SCOPE_TABLES:
        con.execute(f"INSERT INTO {table} SELECT DISTINCT {column} FROM {named} WHERE {column} IS NOT NULL")
    linked = (
        "trace_id IN (FROM scope_traces) OR rollout_id IN (FROM scope_rollouts)"
        " OR session_id IN (FROM scope_sessions)"
    )
    for _ in range(MAX_CLOSURE_STEPS):
        con.execute(
            f"CREATE OR REPLACE TABLE scope_keys AS SELECT *, true AS stored FROM {STATE}.keys WHERE {linked}"
            f" UNION ALL SELECT *, false FROM delta_keys WHERE {linked}"
        )
        added = 0
        for column, table in SCOPE_TABLES:
            (n,) = con.execute(
                f"INSERT INTO {table} SELECT DISTINCT {column} FROM scope_keys WHERE {column} IS NOT NULL"
                f" AND {column} NOT IN (FROM {table})"
            ).fetchone()
            added += n
        if not added:
            return
    raise NormalizeError(f"the scope of these commits still grew after {MAX_CLOSURE_STEPS} steps")


def _old_commits(con: duckdb.DuckDBPyConnection, skipped: frozenset[int]) -> list[int]:
    """The stored commits (before the delta) holding rows of the scope."""
    rows = con.execute("SELECT DISTINCT commit_seq FROM scope_keys WHERE stored ORDER BY 1").fetchall()
    return [commit for (commit,) in rows if commit not in skipped]


def _load_old_rows(con: duckdb.DuckDBPyConnection, raw: archive.RawRows, commits: list[int]) -> None:
    """Copy the scope's rows of earlier commits (in the store or archived) into the scratch tables (an IN list
    of literal commits lets DuckDB skip every other row group, of the store and of the files)."""
    stored = f"commit_seq IN {_int_list(commits)}"
    in_traces = "trace_id IN (FROM scope_traces)"
    con.execute(f"INSERT INTO spans BY NAME {raw.rows('spans', commits)} WHERE {stored} AND {in_traces}")
    con.execute(
        f"INSERT INTO call_tokens BY NAME {raw.rows('call_tokens', commits)} WHERE {stored} AND {in_traces}"
    )
    con.execute(
        f"INSERT INTO logs BY NAME {raw.rows('logs', commits)} WHERE {stored} AND ({in_traces}"
        f" OR {NAMED_ROLLOUT} IN (FROM scope_rollouts) OR {SESSION} IN (FROM scope_sessions))"
    )


def _oldest_written(con: duckdb.DuckDBPyConnection) -> int | None:
    """A commit at or before which no stored normalized row of the scope was written: each name's rows were
    last written by a round that covered its newest stored commit."""
    (lower,) = con.execute(
        "SELECT min(newest) FROM ("
        + " UNION ALL ".join(
            f"SELECT max(commit_seq) AS newest FROM scope_keys"
            f" WHERE stored AND {column} IN (FROM {table}) GROUP BY {column}"
            for column, table in SCOPE_TABLES
        )
        + ")"
    ).fetchone()
    return None if lower is None else int(lower)


# ---------------------------------------------------------------- raw rows deleted (retention.py)


def forget(
    con: duckdb.DuckDBPyConnection,
    *,
    deleted: pa.Table,
    gone: pa.Table,
    log_seqs: pa.Table,
    requested_at: datetime,
) -> pa.Table:
    """In the caller's transaction, as retention deletes raw rows: queue the names the `deleted` commits named
    for the next round to recompute from what remains (a name nothing remains of loses its rows), delete the
    keys rows of the commits nothing remains of (`gone`), and the rewards rows placed nowhere whose log
    records (by `log_seqs`) go: no scope owns those. Returns the names queued."""
    given = {"deleted_commits": deleted, "gone_commits": gone, "deleted_logs": log_seqs}
    for name, rows in given.items():
        con.register(name, rows)
    try:
        queued = con.sql(
            f"SELECT DISTINCT {', '.join(SCOPE_COLUMNS)}, ?::TIMESTAMPTZ AS requested_at FROM {STATE}.keys"
            " WHERE commit_seq IN (SELECT commit_seq FROM deleted_commits)",
            params=[requested_at],
        ).to_arrow_table()
        con.register("queued", queued)
        con.execute(f"INSERT INTO {STATE}.renormalize SELECT * FROM queued").fetchall()
        con.execute(f"DELETE FROM {STATE}.keys WHERE commit_seq IN (FROM gone_commits)").fetchall()
        if _exists(con, "rewards"):
            con.execute(
                f"DELETE FROM {STATE}.rewards WHERE trace_id IS NULL AND rollout_id IS NULL"
                " AND seq IN (FROM deleted_logs)"
            ).fetchall()
    finally:
        for name in (*given, "queued"):
            con.unregister(name)
    return queued


def _exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the store has the normalized table `name` (its transforms may define fewer)."""
    [(found,)] = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'normalized'"
        " AND table_name = ?",
        [CATALOG, name],
    ).fetchall()
    return found > 0


def _int_list(values: object) -> str:
    return "(" + ", ".join(str(int(v)) for v in sorted(values)) + ")"
