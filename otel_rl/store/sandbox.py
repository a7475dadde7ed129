"""The query sandbox: user SQL reads the store and nothing else, changes nothing, and stops within limits."""

import contextlib
import threading
import time
from collections.abc import Callable

import duckdb
import pyarrow as pa

from otel_rl.store.connection import cursor

# Instance-wide, and permanent once the configuration is locked (no statement can turn them back on): no file,
# URL, other database or extension can be reached, whatever a statement's shape, because DuckDB checks at
# each access rather than by reading the SQL. It also stops DuckDB reading Python objects by their variable
# name (replacement scans): the store's writer registers its Arrow tables instead.
LOCK_DOWN = (
    "SET enable_external_access = false",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    "SET lock_configuration = true",
)
# The tables the writer fills: a statement reading only these needs no normalized table caught up.
RAW_TABLE_NAMES = frozenset(
    {
        "spans",
        "call_tokens",
        "logs",
        "metric_points",
        "rollout_keys",
        "rollout_key_revocations",
        "tasks",
        "view_sources",
    }
)
# A statement's parameters ($1, $name or ?), bound by DuckDB: a list for positional ones, a dict for named.
Scalar = str | int | float | bool | None
Params = list[Scalar] | dict[str, Scalar]
MAX_PARAMS = 10_000  # values one statement may bind (/v1/query refuses more; the reads bind ids in chunks)
BATCH_ROWS = 16_384  # rows per Arrow batch read from DuckDB: the result bound is checked after each
WATCH_TICK_S = 0.05  # how often a running statement's deadline and stop are checked


class ReadOnlyViolation(ValueError):
    """The SQL is not a single read statement, or it tried to write or reach outside the store (HTTP 400)."""


class QueryFailed(ValueError):
    """DuckDB could not run the statement (a syntax, binding or runtime error: HTTP 400)."""


class QueryInterrupted(RuntimeError):
    """The statement was stopped before its end (its client left, or the server is stopping: HTTP 503)."""


class QueryTimeout(QueryInterrupted):
    """The statement ran past its time limit (HTTP 408)."""


class ResultTooLarge(ValueError):
    """The result is larger than the bound on result size (HTTP 413)."""


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Lock the DuckDB instance of `con` (every cursor of it) to its attached databases, for good."""
    for statement in LOCK_DOWN:
        con.execute(statement)


def check_read_only(sql: str) -> None:
    """Raise ReadOnlyViolation unless `sql` is exactly one SELECT (WITH, FROM, DESCRIBE, SHOW, SUMMARIZE).

    A first gate, for a clear message: what a statement may do is enforced by DuckDB (see `UserQuery`).
    """
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ReadOnlyViolation(f"the SQL could not be parsed: {exc}") from None
    if len(statements) != 1:
        raise ReadOnlyViolation(f"send exactly one statement (got {len(statements)})")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise ReadOnlyViolation(
            f"only read queries are allowed (SELECT, WITH, DESCRIBE, SHOW); this is a {kind.name} statement"
        )


def reads_raw_tables_only(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Whether `sql` names raw tables only (or none: table functions), by DuckDB's parser; False when it does
    not parse (the query then fails on its own)."""
    try:
        return con.get_table_names(_parameters_as_null(sql)) <= RAW_TABLE_NAMES
    except duckdb.Error:
        return False


def _parameters_as_null(sql: str) -> str:
    """`sql` with each parameter ($1, $name, ?) read as NULL, for get_table_names (which refuses parameters):
    by DuckDB's tokenizer, so that a `?` or `$` inside a string or a quoted name stays as it is."""
    tokens = duckdb.tokenize(sql)
    starts = [start for start, _ in tokens] + [len(sql)]
    pieces, done = [], 0
    for i, (start, kind) in enumerate(tokens):
        if kind != duckdb.token_type.operator or start < done:
            continue
        if sql[start] == "?":
            end = start + 1
        elif sql[start] == "$" and starts[i + 1] == start + 1 and i + 1 < len(tokens):
            end = starts[i + 2]  # the parameter's number or name, up to the next token
        else:
            continue
        pieces += [sql[done:start], " NULL "]
        done = end
    return "".join(pieces) + sql[done:]


class UserQuery:
    """One user statement on a cursor of its own of a locked-down store connection, in a read-only transaction
    (DuckDB refuses any write in it, a `WITH d AS (DELETE ... RETURNING *)` included), rolled back after.

    `run()` in one thread; `stop(reason)` from any other (a timer, a disconnected client, shutdown).
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        sql: str,
        *,
        max_result_bytes: int | None = None,
        timeout_s: float | None = None,
        prepare: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
        params: Params | None = None,
    ) -> None:
        check_read_only(sql)
        self.sql = sql
        self.params = params
        self._con = con
        # Called with the statement's cursor inside its transaction, before the statement (the archive's
        # temporary views: archive.shadow_raw_tables).
        self._prepare = prepare
        self._max_result_bytes = max_result_bytes
        self._timeout_s = timeout_s
        self._cursor: duckdb.DuckDBPyConnection | None = None
        self._stopped: QueryInterrupted | None = None
        # Called in run()'s thread before the statement with the seconds left of the limit (None: no limit):
        # the store's wait for its normalized tables, which the limit covers too.
        self.before_run: Callable[[float | None], None] | None = None
        self._lock = threading.Lock()

    def stop(self, reason: QueryInterrupted) -> None:
        """Interrupt the statement (or keep it from starting); `run()` then raises `reason`."""
        with self._lock:
            self._stopped = self._stopped or reason
            if self._cursor is not None:
                self._cursor.interrupt()

    def run(self) -> pa.Table:
        """The statement's result; ReadOnlyViolation, QueryFailed, QueryInterrupted or ResultTooLarge."""
        deadline = None if self._timeout_s is None else time.monotonic() + self._timeout_s
        if self.before_run is not None:
            self.before_run(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            self._cursor = own = cursor(self._con)
        done = threading.Event()
        watchdog = threading.Thread(target=self._watch, args=(own, done, deadline), daemon=True)
        reader = None
        try:
            own.execute("BEGIN TRANSACTION READ ONLY")
            watchdog.start()
            if self._prepare is not None:
                self._prepare(own)
            reader = own.sql(self.sql, params=self.params).to_arrow_reader(BATCH_ROWS)
            return self._read(reader)
        except (duckdb.Error, pa.ArrowException, OSError) as exc:
            # An interrupted read fails with DuckDB's error, or with Arrow's OSError mid-stream.
            if self._stopped is not None:
                raise self._stopped from None
            raise _refusal(exc) from None
        finally:
            done.set()
            if watchdog.is_alive():
                watchdog.join()
            with self._lock:
                if reader is not None:
                    reader.close()  # DuckDB refuses the rollback while its result is open
                with contextlib.suppress(duckdb.Error):
                    own.execute("ROLLBACK")
                own.close()
                self._cursor = None  # a late stop() has nothing left to interrupt

    def _watch(self, own: duckdb.DuckDBPyConnection, done: threading.Event, deadline: float | None) -> None:
        """Interrupt the statement once it is stopped or past its deadline, again at each tick until it ends:
        DuckDB drops an interrupt that lands before the statement has started."""
        while not done.wait(WATCH_TICK_S):
            if self._stopped is None and deadline is not None and time.monotonic() >= deadline:
                self._stopped = QueryTimeout(
                    f"the query ran longer than {self._timeout_s:g} s, the server's limit (--query-timeout):"
                    " narrow it with WHERE or LIMIT"
                )
            if self._stopped is not None:
                own.interrupt()

    def _read(self, reader: pa.RecordBatchReader) -> pa.Table:
        batches, size = [], 0
        for batch in reader:
            size += batch.get_total_buffer_size()
            if self._max_result_bytes is not None and size > self._max_result_bytes:
                raise ResultTooLarge(
                    f"the result is larger than {self._max_result_bytes:,} bytes, the server's limit"
                    " (--query-max-bytes): select fewer columns, aggregate, or add LIMIT"
                )
            batches.append(batch)
        return pa.Table.from_batches(batches, reader.schema)


def _refusal(exc: Exception) -> Exception:
    """DuckDB's error as the sandbox's: what DuckDB refused names the rule broken."""
    if isinstance(exc, duckdb.PermissionException):
        return ReadOnlyViolation(f"queries cannot reach files, URLs, other databases or extensions: {exc}")
    if isinstance(exc, duckdb.TransactionException):
        return ReadOnlyViolation(f"queries cannot change the store: {exc}")
    return QueryFailed(str(exc))
