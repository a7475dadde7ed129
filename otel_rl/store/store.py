"""The DuckDB store: one file holding the raw OTLP tables, the normalized views and rollout keys."""

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from otel_rl.store import archive, archiver, normalize, retention, wal
from otel_rl.store.connection import connect, cursor
from otel_rl.store.definitions import normalized_fingerprint, read_definitions
from otel_rl.store.keys import StoredKey, key_row, read_keys, revocation_rows
from otel_rl.store.layout import LAYOUTS
from otel_rl.store.normalizer import Normalizer, NotNormalized
from otel_rl.store.retention import ArchivePolicy, ArchiveReport
from otel_rl.store.sandbox import Params, UserQuery, lock_down, reads_raw_tables_only
from otel_rl.store.schema import (
    COMMIT_NUMBERED,
    Schema,
    create_tables,
    create_views,
    default_transforms_dir,
    last_commit,
)
from otel_rl.store.writer import CHECKPOINT_THRESHOLD, Batch, GroupCommitWriter, Saturated, StoreUnavailable

log = logging.getLogger(__name__)

NORMALIZED_WAIT_S = 600.0  # how long an in-process read waits for the normalized tables without a timeout
DEFAULT_MAX_PENDING_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class IngestResult:
    """What a durable ingest stored: records accepted (duplicates of stored records included)."""

    accepted: int


class Store:
    """One DuckDB file; the only writer of it. Writes go through a group-commit writer thread; a normalizer
    thread keeps the normalized tables (llm_calls, rollouts, rewards...) caught up with them."""

    def __init__(
        self,
        path: str | Path,
        *,
        transforms_dir: Path | None = None,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._transforms_dir = transforms_dir or default_transforms_dir()
        self.views: dict[str, str | None] = {}
        # What of the WAL (the commits since the last checkpoint) the open below replays: None if no WAL.
        # Read before DuckDB opens the file: it deletes or overwrites the WAL, and with it the evidence.
        self.wal_at_open = wal.check_before_open(self.path)
        self._generation = 0  # of the connection: a new one after each reopen
        self._con, schema = self._open()
        archiver.finish_interrupted(self._con, self.path)
        self._archiving = threading.Lock()  # one archive run at a time
        self._publishing = threading.Lock()  # held by a run from its commit to its renames (archiver.py)
        self._seq_lock = threading.Lock()
        logs = archive.raw_rows(self.path, archive.listed_files(self._con), "logs", "logs")
        (last_seq,) = self._con.execute(f"SELECT coalesce(max(seq) + 1, 0) FROM ({logs})").fetchone()
        self._next_log_seq = int(last_seq)
        committed = last_commit(self._con)
        self._normalizer = Normalizer(
            self._normalizer_cursor,
            schema.files,
            schema.fingerprint,
            through=min(schema.through, committed),
            committed=committed,
            fills=schema.fills,
        )
        self._writer = GroupCommitWriter(
            cursor(self._con),
            insert_batch,
            max_pending_bytes=max_pending_bytes,
            reopen=self._reopen,
            last_commit_seq=committed,
            on_commit=self._normalizer.committed,
        )

    def _open(self) -> tuple[duckdb.DuckDBPyConnection, Schema]:
        """A connection to the file with everything the store applies to it (at start and on every reopen).

        Queries through the server run on one core (see connect). Raises StoreDamaged when DuckDB refuses
        to replay the WAL.
        """
        try:
            con = connect(self.path)
        except duckdb.Error as exc:
            if wal.is_replay_error(exc):
                raise wal.StoreDamaged(wal.damaged_store_message(self.path, exc)) from exc
            raise
        con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
        create_tables(con)
        schema = create_views(con, self._transforms_dir)
        self.views = schema.views
        archive.allow_reading(con, [self.path])
        lock_down(con)  # last: the settings above are locked from here on (see sandbox.py)
        return con, schema

    def _reopen(self) -> duckdb.DuckDBPyConnection:
        """The writer's new connection after DuckDB invalidated the database (see GroupCommitWriter)."""
        # Closed first: two DuckDB instances of one process must not hold the same file. No normalization
        # round may be using it meanwhile.
        with self._normalizer.paused():
            self._con.close()
            self._con, _ = self._open()
            self._generation += 1
        return cursor(self._con)

    def _normalizer_cursor(self) -> tuple[duckdb.DuckDBPyConnection, int]:
        return cursor(self._con), self._generation

    # ---------------------------------------------------------------- writes

    def reserve_log_seqs(self, n_records: int) -> int:
        """The first of `n_records` consecutive log sequence numbers (the store's arrival order)."""
        with self._seq_lock:
            seq_start = self._next_log_seq
            self._next_log_seq += n_records
        return seq_start

    def submit(self, batch: Batch, *, dedup: bool = True) -> Future:
        """Queue rows for the next group commit; the future resolves once they are on disk.

        `dedup=False` is for rows new by construction (the gateway's call spans, with fresh random span ids):
        they skip the anti-join against stored keys, half of what a small commit costs. Raises `Saturated`
        when the write queue is full, `StoreUnavailable` for a while after a write failed for lack of space
        (the future fails with it too), and `StoreClosed` once closing.
        """
        return self._writer.submit(batch, dedup=dedup)

    @property
    def commits(self) -> int:
        """Group commits so far (batches written divided by this is the mean group size)."""
        return self._writer.commits

    @property
    def writer(self) -> GroupCommitWriter:
        """The group-commit writer: its queue and commit timings, for the server's /metrics."""
        return self._writer

    def write(self, batch: Batch, main_table: str, *, dedup: bool = True) -> IngestResult:
        """Store a batch durably: blocks until committed, waiting while the write queue is full (in-process
        producers have no retry logic of their own: a full queue makes them wait, not fail)."""
        while True:
            try:
                future = self.submit(batch, dedup=dedup)
                break
            except Saturated:
                time.sleep(0.01)
        future.result()
        return IngestResult(accepted=batch[main_table].num_rows)

    def add_rollout_key(self, key: StoredKey) -> None:
        """Store a rollout key's hash, attempt and expiry durably (through the writer: the group commit)."""
        self.submit({"rollout_keys": key_row(key, _now())}).result()

    def revoke_rollout_keys(self, key_hashes: Iterable[str], reason: str) -> None:
        """Refuse these rollout keys from now on, for good (a key revoked already keeps its first reason)."""
        self.submit({"rollout_key_revocations": revocation_rows(key_hashes, reason, _now())}).result()

    def rollout_keys(self, lifetime_s: float) -> dict[str, StoredKey]:
        """Every stored rollout key by hash, revoked ones with their reason (`lifetime_s`: see read_keys)."""
        return read_keys(cursor(self._con), lifetime_s)

    # ---------------------------------------------------------------- reads

    def query_arrow(self, sql: str, params: Params | None = None) -> pa.Table:
        """The result of one read-only statement (SELECT, DESCRIBE...), run in the sandbox (sandbox.py), its
        parameters bound by DuckDB."""
        return self.user_query(sql, params=params).run()

    def user_query(
        self,
        sql: str,
        *,
        max_result_bytes: int | None = None,
        timeout_s: float | None = None,
        after_commit: int | None = None,
        params: Params | None = None,
    ) -> UserQuery:
        """One user statement to `run()` in the sandbox, which another thread may `stop()`. It runs once the
        normalized tables include every commit made before it started (unless it reads raw tables only), or
        with `after_commit`, commit `after_commit` (an earlier read's `seen_through()`): a reader that saw
        raw rows reads their normalized rows without waiting for what arrived since. ValueError when that
        commit was not made."""
        if after_commit is not None and after_commit > self._writer.last_commit_seq:
            raise ValueError(
                f"after_commit {after_commit}: the store's last commit is {self._writer.last_commit_seq}"
            )
        query = UserQuery(
            self._con,
            sql,
            max_result_bytes=max_result_bytes,
            timeout_s=timeout_s,
            prepare=self._read_archive,
            params=params,
        )
        query.before_run = partial(self._wait_unless_raw, sql, after_commit=after_commit)
        return query

    def seen_through(self) -> int:
        """Asked after a read: no row it saw was written after this commit."""
        return self._writer.seen_through()

    def _wait_unless_raw(self, sql: str, timeout_s: float | None, after_commit: int | None) -> None:
        parser = cursor(self._con)  # a cursor of its own: a DuckDB connection serves one thread at a time
        try:
            raw = reads_raw_tables_only(parser, sql)
        finally:
            parser.close()
        if not raw:
            self.wait_normalized(timeout_s, after_commit)

    def _read_archive(self, query_cursor: duckdb.DuckDBPyConnection) -> None:
        """Make a query's raw tables (and the views over them) read the archived rows too."""
        with self._publishing:  # a file listed in the query's snapshot has its name by now
            files = archive.listed_files(query_cursor)
        archive.shadow_raw_tables(query_cursor, self.path, files)

    def wait_normalized(self, timeout_s: float | None = None, after_commit: int | None = None) -> None:
        """Block until the normalized tables include every commit made so far (or commit `after_commit`);
        NotNormalized after `timeout_s` (NORMALIZED_WAIT_S when None)."""
        target = self._writer.last_commit_seq if after_commit is None else after_commit
        timeout_s = NORMALIZED_WAIT_S if timeout_s is None else timeout_s
        if not self._normalizer.wait_for(target, timeout_s):
            raise NotNormalized(f"waited {timeout_s:.1f} s for commit {target}: {self._normalizer.behind()}")

    # ---------------------------------------------------------------- archive and retention

    def archive(self, policy: ArchivePolicy) -> ArchiveReport:
        """Move the raw rows received before `policy.before` into the archive, then apply its retention
        (retention.py); PolicyError when it asks for the impossible. Runs one at a time."""
        today = datetime.now(UTC).date()
        policy.check(today)
        with self._archiving:
            con = cursor(self._con)
            try:
                report = retention.run(con, self.path, policy, today, publishing=self._publishing)
            finally:
                con.close()
        deleted = report.deleted
        if deleted is not None and deleted.renormalize.num_rows:
            # Rounds follow the writer's commits: the queued names again, as a commit, make one run now.
            try:
                self.write({normalize.RENORMALIZE: deleted.renormalize}, normalize.RENORMALIZE, dedup=False)
            except StoreUnavailable as exc:  # they are queued durably: the next round takes them
                log.warning("the normalized tables drop the deleted rows at the next commit: %s", exc)
        return report

    @property
    def normalizer(self) -> Normalizer:
        """The normalizer: its watermark, lag and rounds, for /healthz and /metrics."""
        return self._normalizer

    @property
    def write_failure(self) -> str | None:
        """Why writes are refused now (a full disk...), until one succeeds again; None while they work."""
        return self._writer.failure

    def close(self) -> None:
        """Write what is pending, normalize it, checkpoint, and close the file."""
        self._writer.close()
        self._normalizer.close()
        try:
            self._con.execute("CHECKPOINT")
        except duckdb.Error as exc:
            # The committed rows are in the WAL, replayed at the next open: closing must not lose or hang.
            log.error("the checkpoint at close failed (the WAL keeps every commit): %s", exc)
        self._con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def insert_batch(
    con: duckdb.DuckDBPyConnection, tables: dict[str, pa.Table], *, dedup: bool = True, commit_seq: int
) -> None:
    """Insert each raw table's rows as one statement; with `dedup`, skipping rows whose key is stored or
    repeated in the batch.

    An anti-join, not a unique index + INSERT OR IGNORE: measured 35K vs 22K spans/s at 1.5M stored rows
    (the index costs on every insert and grows in memory); only this single writer inserts, so it is exact.
    A call's tokens come in the batch of its span: they are stored when the span is, so that no commit scans
    every stored call's key (call_tokens has no column to bound that scan by; it cost a gateway call 17 µs of
    CPU at 30K stored calls, and grows with them).
    """
    if not dedup:
        for name, rows in tables.items():
            _insert(con, name, rows, commit_seq)
        return
    new_spans: set[tuple[str, str]] = set()
    for name in sorted(tables, key=lambda name: name != "spans"):  # spans first: their tokens follow them
        rows = first_of_each_key(tables[name], LAYOUTS[name].key)
        if name == "call_tokens":
            keys = zip(rows.column("trace_id").to_pylist(), rows.column("span_id").to_pylist(), strict=True)
            rows = rows.filter(pa.array([key in new_spans for key in keys], pa.bool_()))
            _insert(con, name, rows, commit_seq)
            continue
        # the inserted keys only when tokens follow (returning them costs every OTLP request a little)
        returning = LAYOUTS[name].key if name == "spans" and "call_tokens" in tables else ()
        inserted = _insert(con, name, rows, commit_seq, _not_stored(name, rows), returning)
        if returning:
            new_spans = set(inserted)


def _not_stored(table: str, rows: pa.Table) -> str:
    """The WHERE clause keeping the rows of `incoming` whose key is not in `table` yet."""
    on = " AND ".join(f"stored.{column} = incoming.{column}" for column in LAYOUTS[table].key)
    column = LAYOUTS[table].sent_time
    bounds = pc.min_max(rows.column(column)).values() if column and rows.num_rows else ()
    if bounds and all(bound.is_valid for bound in bounds):
        lo, hi = (bound.as_py() for bound in bounds)
        on += f" AND stored.{column} = incoming.{column} AND stored.{column} BETWEEN {lo} AND {hi}"
    return f" WHERE NOT EXISTS (SELECT 1 FROM {table} AS stored WHERE {on})"


def _insert(
    con: duckdb.DuckDBPyConnection,
    table: str,
    rows: pa.Table,
    commit_seq: int,
    where: str = "",
    returning: tuple[str, ...] = (),
) -> list[tuple]:
    """INSERT the rows (those matching `where`, over them as `incoming`), numbered with the commit in the
    tables that carry it; the `returning` columns of each."""
    # Registered, not read by its Python name: the sandbox's lock-down turns replacement scans off. Measured
    # per 2-row statement: 1.8-2.0 ms, vs 1.4-1.6 ms by name and 3.0-4.3 ms for a relation's query().
    con.register("incoming", rows)
    try:
        returned = f" RETURNING {', '.join(returning)}" if returning else ""
        numbered = f", {commit_seq}::UBIGINT AS commit_seq" if table in COMMIT_NUMBERED else ""
        sql = f"INSERT INTO {table} BY NAME SELECT *{numbered} FROM incoming{where}{returned}"
        result = con.execute(sql).fetchall()
    finally:
        con.unregister("incoming")
    return result if returning else []


def first_of_each_key(rows: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """The rows without later repeats of a key (cheap when, as usual, there are none)."""
    columns = [rows.column(name) for name in key]
    joined = columns[0] if len(columns) == 1 else pc.binary_join_element_wise(*columns, "\x00")
    if pc.count_distinct(joined, mode="all").as_py() == rows.num_rows:
        return rows
    positions = pa.table({"key": joined, "position": pa.array(range(rows.num_rows), pa.int64())})
    first = positions.group_by("key", use_threads=False).aggregate([("position", "min")])
    return rows.take(sorted(first.column("position_min").to_pylist()))


def normalized_lag(path: Path) -> int | None:
    """Commits the store file's normalized tables lack, read without writing: all of them for a store made
    by an earlier version or normalized by other view definitions (opening it normalizes everything again).
    None while another process (a server) holds the file."""
    try:
        con = connect(path, read_only=True)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            return None
        raise
    try:
        last = last_commit(con)
        through, fingerprint = normalize.read_state(con)
    except duckdb.CatalogException:  # made before the normalized tables: no state, or no commit numbers
        return 1
    finally:
        con.close()
    if fingerprint != normalized_fingerprint(read_definitions(default_transforms_dir())):
        through = 0
    # The watermark can pass the last commit that wrote rows: a commit whose rows were all duplicates keeps
    # its number and stores nothing. That is no lag.
    return max(0, last - through)


def catch_up(path: Path) -> None:
    """Open the store file as its writer until its normalized tables include every commit (closing
    normalizes what is left). Raises duckdb.IOException when another process holds it."""
    Store(path).close()


def _now() -> datetime:
    return datetime.now(UTC)
