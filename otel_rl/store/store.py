"""The DuckDB store: one file holding the raw OTLP tables, the normalized views and rollout keys."""

import hashlib
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_rl.collector import flatten, metrics
from otel_rl.store import wal
from otel_rl.store.connection import connect, cursor
from otel_rl.store.sandbox import UserQuery, lock_down
from otel_rl.store.writer import CHECKPOINT_THRESHOLD, Batch, GroupCommitWriter, Saturated

log = logging.getLogger(__name__)

# Rows that are the same record: a retried export or a duplicate inside one request is stored once.
DEDUP_KEYS = {
    "spans": ("trace_id", "span_id"),
    "call_tokens": ("trace_id", "span_id"),
    "logs": ("content_key",),
    "metric_points": ("content_key",),
    "rollout_keys": ("key_hash",),
}
# A retried export resends a record unchanged, so a stored duplicate has the same value here. Bounding the
# stored side by the batch's min and max (as literals) lets DuckDB skip row groups by their min/max: without
# it every commit scans every stored key (65 ms of CPU per 2,048-span commit at 1M spans, about 5 ms with it).
TIME_COLUMNS = {"spans": "start_time_unix_nano", "logs": "time_unix_nano", "metric_points": "time_unix_nano"}
_STORE_TABLES_SQL = """
CREATE TABLE IF NOT EXISTS view_sources (   -- the transforms/*.sql files whose views are in place
    position    INTEGER NOT NULL,
    file        VARCHAR NOT NULL,
    sha256      VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS rollout_keys (
    key_hash    VARCHAR NOT NULL,   -- sha256 of the key: the key itself is never stored
    rollout_id  VARCHAR NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);
"""
DEFAULT_MAX_PENDING_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class IngestResult:
    """What a durable ingest stored: records accepted (duplicates of stored records included)."""

    accepted: int


class Store:
    """One DuckDB file; the only writer of it. Writes go through a group-commit writer thread."""

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
        self._con = self._open()
        self._seq_lock = threading.Lock()
        (last_seq,) = self._con.execute("SELECT coalesce(max(seq) + 1, 0) FROM logs").fetchone()
        self._next_log_seq = int(last_seq)
        self._writer = GroupCommitWriter(
            cursor(self._con), insert_batch, max_pending_bytes=max_pending_bytes, reopen=self._reopen
        )

    def _open(self) -> duckdb.DuckDBPyConnection:
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
        self.views = create_tables_and_views(con, self._transforms_dir)
        lock_down(con)  # last: the settings above are locked from here on (see sandbox.py)
        return con

    def _reopen(self) -> duckdb.DuckDBPyConnection:
        """The writer's new connection after DuckDB invalidated the database (see GroupCommitWriter)."""
        # Closed first: two DuckDB instances of one process must not hold the same file.
        self._con.close()
        self._con = self._open()
        return cursor(self._con)

    # ---------------------------------------------------------------- writes

    def traces_batch(self, request: ExportTraceServiceRequest) -> Batch:
        """The raw-table rows of an ExportTraceServiceRequest."""
        return flatten.traces_to_tables(request, _now())

    def logs_batch(self, request: ExportLogsServiceRequest) -> Batch:
        """The raw-table rows of an ExportLogsServiceRequest, numbered in arrival order."""
        n_records = sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
        with self._seq_lock:
            seq_start = self._next_log_seq
            self._next_log_seq += n_records
        return flatten.logs_to_tables(request, _now(), seq_start)

    def metrics_batch(self, request: ExportMetricsServiceRequest) -> Batch:
        """The raw-table rows of an ExportMetricsServiceRequest."""
        return metrics.metrics_to_tables(request, _now())

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

    def ingest_traces(self, request: ExportTraceServiceRequest) -> IngestResult:
        """Store an ExportTraceServiceRequest durably (blocks until committed, waits while saturated)."""
        return self._ingest(self.traces_batch(request), "spans")

    def ingest_logs(self, request: ExportLogsServiceRequest) -> IngestResult:
        """Store an ExportLogsServiceRequest durably (blocks until committed)."""
        return self._ingest(self.logs_batch(request), "logs")

    def ingest_metrics(self, request: ExportMetricsServiceRequest) -> IngestResult:
        """Store an ExportMetricsServiceRequest durably (blocks until committed)."""
        return self._ingest(self.metrics_batch(request), "metric_points")

    def _ingest(self, batch: Batch, main_table: str) -> IngestResult:
        # In-process producers have no retry logic of their own: a full queue makes them wait, not fail.
        while True:
            try:
                future = self.submit(batch)
                break
            except Saturated:
                time.sleep(0.01)
        future.result()
        return IngestResult(accepted=batch[main_table].num_rows)

    def add_rollout_key(self, key_hash: str, rollout_id: str) -> None:
        """Store a rollout key's hash durably (through the writer, so it shares the group commit)."""
        row = pa.table(
            {
                "key_hash": [key_hash],
                "rollout_id": [rollout_id],
                "created_at": pa.array([_now()], pa.timestamp("us", tz="UTC")),
            }
        )
        self.submit({"rollout_keys": row}).result()

    def rollout_keys(self) -> dict[str, str]:
        """Every stored rollout key hash -> its rollout id."""
        return dict(cursor(self._con).execute("SELECT key_hash, rollout_id FROM rollout_keys").fetchall())

    # ---------------------------------------------------------------- reads

    def query_arrow(self, sql: str) -> pa.Table:
        """The result of one read-only statement (SELECT, DESCRIBE...), run in the sandbox (sandbox.py)."""
        return self.user_query(sql).run()

    def user_query(
        self, sql: str, *, max_result_bytes: int | None = None, timeout_s: float | None = None
    ) -> UserQuery:
        """One user statement to `run()` in the sandbox, which another thread may `stop()`."""
        return UserQuery(self._con, sql, max_result_bytes=max_result_bytes, timeout_s=timeout_s)

    @property
    def write_failure(self) -> str | None:
        """Why writes are refused now (a full disk...), until one succeeds again; None while they work."""
        return self._writer.failure

    def close(self) -> None:
        """Write what is pending, checkpoint, and close the file."""
        self._writer.close()
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


def insert_batch(con: duckdb.DuckDBPyConnection, tables: dict[str, pa.Table], *, dedup: bool = True) -> None:
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
            _insert(con, name, rows)
        return
    new_spans: set[tuple[str, str]] = set()
    for name in sorted(tables, key=lambda name: name != "spans"):  # spans first: their tokens follow them
        rows = first_of_each_key(tables[name], DEDUP_KEYS[name])
        if name == "call_tokens":
            keys = zip(rows.column("trace_id").to_pylist(), rows.column("span_id").to_pylist(), strict=True)
            rows = rows.filter(pa.array([key in new_spans for key in keys], pa.bool_()))
            _insert(con, name, rows)
            continue
        # the inserted keys only when tokens follow (returning them costs every OTLP request a little)
        returning = DEDUP_KEYS[name] if name == "spans" and "call_tokens" in tables else ()
        inserted = _insert(con, name, rows, _not_stored(name, rows), returning)
        if returning:
            new_spans = set(inserted)


def _not_stored(table: str, rows: pa.Table) -> str:
    """The WHERE clause keeping the rows of `incoming` whose key is not in `table` yet."""
    on = " AND ".join(f"stored.{column} = incoming.{column}" for column in DEDUP_KEYS[table])
    column = TIME_COLUMNS.get(table)
    bounds = pc.min_max(rows.column(column)).values() if column and rows.num_rows else ()
    if bounds and all(bound.is_valid for bound in bounds):
        lo, hi = (bound.as_py() for bound in bounds)
        on += f" AND stored.{column} = incoming.{column} AND stored.{column} BETWEEN {lo} AND {hi}"
    return f" WHERE NOT EXISTS (SELECT 1 FROM {table} AS stored WHERE {on})"


def _insert(
    con: duckdb.DuckDBPyConnection,
    table: str,
    rows: pa.Table,
    where: str = "",
    returning: tuple[str, ...] = (),
) -> list[tuple]:
    """INSERT the rows (those matching `where`, over them as `incoming`); the `returning` columns of each."""
    # Registered, not read by its Python name: the sandbox's lock-down turns replacement scans off. Measured
    # per 2-row statement: 1.8-2.0 ms, vs 1.4-1.6 ms by name and 3.0-4.3 ms for a relation's query().
    con.register("incoming", rows)
    try:
        returned = f" RETURNING {', '.join(returning)}" if returning else ""
        sql = f"INSERT INTO {table} BY NAME SELECT * FROM incoming{where}{returned}"
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


def default_transforms_dir() -> Path:
    """The view SQL: `transforms/` of a checkout, or its copy inside an installed wheel."""
    checkout = Path(__file__).resolve().parents[2] / "transforms"
    return checkout if checkout.is_dir() else Path(__file__).resolve().parents[1] / "_sql"


def create_tables_and_views(con: duckdb.DuckDBPyConnection, transforms_dir: Path) -> dict[str, str | None]:
    """The raw tables (schema.sql) and the store's own, where missing, then the views (see create_views)."""
    con.execute(resources.files("otel_rl.store").joinpath("schema.sql").read_text())
    con.execute(_STORE_TABLES_SQL)
    return create_views(con, transforms_dir)


def create_views(con: duckdb.DuckDBPyConnection, transforms_dir: Path) -> dict[str, str | None]:
    """(Re)create the views of each `*.sql` file in `transforms_dir` in file-name order.

    Returns each file's error (None when it worked). Files are run from the first one that changed (or
    failed) since the last open: binding the views takes seconds, and restarts should not. A broken
    view file is logged, not fatal: ingest does not depend on views, and the store must keep taking
    data while someone fixes the SQL.
    """
    files = sorted(transforms_dir.glob("*.sql")) if transforms_dir.is_dir() else []
    sources = [(file.name, hashlib.sha256(file.read_bytes()).hexdigest()) for file in files]
    created = con.execute("SELECT file, sha256 FROM view_sources ORDER BY position").fetchall()
    unchanged = 0
    while unchanged < min(len(sources), len(created)) and sources[unchanged] == tuple(created[unchanged]):
        unchanged += 1
    outcome: dict[str, str | None] = {name: None for name, _ in sources[:unchanged]}
    for file in files[unchanged:]:
        try:
            con.execute(file.read_text())
            outcome[file.name] = None
        except duckdb.Error as exc:
            log.error("views of %s were not created: %s", file, exc)
            outcome[file.name] = str(exc)
    # Remember the files in place, up to the first that failed: the next open starts there.
    first_failed = next((i for i, (name, _) in enumerate(sources) if outcome[name]), len(sources))
    in_place = pa.table(
        {
            "position": pa.array(range(first_failed), pa.int32()),
            "file": [name for name, _ in sources[:first_failed]],
            "sha256": [digest for _, digest in sources[:first_failed]],
        }
    )
    if [tuple(row) for row in created] == sources[:first_failed]:
        return outcome  # nothing to record: a reopen on a full disk must not need to write
    con.execute("BEGIN TRANSACTION")
    con.execute("DELETE FROM view_sources")
    con.register("in_place", in_place)
    con.execute("INSERT INTO view_sources SELECT * FROM in_place")
    con.unregister("in_place")
    con.execute("COMMIT")
    return outcome


def _now() -> datetime:
    return datetime.now(UTC)
