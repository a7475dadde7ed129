"""The store's single writer: group commit of Arrow batches into DuckDB, durable before callers hear back."""

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import duckdb
import pyarrow as pa

log = logging.getLogger(__name__)

Batch = dict[str, pa.Table]  # raw table name -> rows for it
# DuckDB checkpoints (folds its WAL into the file) once the WAL is this large. Small folds re-compress
# row groups that later folds touch again: with DuckDB's default of 16 MB (about 6,000 GenAI spans) commit
# and checkpoints took 0.013 CPU-s per 1,000 spans, with 256 MB 0.009. The price: up to this much WAL to
# replay when the store is opened after a crash.
CHECKPOINT_THRESHOLD = "256MB"


class Saturated(RuntimeError):
    """The write queue is full (HTTP 429, gRPC RESOURCE_EXHAUSTED): retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreClosed(RuntimeError):
    """The store is shutting down and takes no more writes (HTTP 503, gRPC UNAVAILABLE)."""


@dataclass
class _Pending:
    batch: Batch
    nbytes: int
    done: Future
    dedup: bool


class GroupCommitWriter:
    """Takes every batch pending, inserts one Arrow table per raw table, commits once, then resolves all.

    `insert(con, {table_name: arrow_table}, dedup=...)` does the inserts (with their dedup, for batches
    submitted with it); the writer owns transactions.
    DuckDB writes and syncs its WAL on COMMIT, so a resolved future means the rows are on disk.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        insert: Callable[..., None],
        *,
        max_pending_bytes: int,
    ) -> None:
        self._con = con
        self._con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
        self._insert = insert
        self._max_pending_bytes = max_pending_bytes
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._closing = False
        self.commits = 0  # transactions committed so far (each holds one or more batches)
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="otel-rl-store-writer", daemon=True)
        self._thread.start()

    def submit(self, batch: Batch, *, dedup: bool = True) -> Future:
        """Queue a batch; the future resolves (to None) once it is committed, or fails with the error."""
        nbytes = sum(table.get_total_buffer_size() for table in batch.values())
        done: Future = Future()
        with self._wake:
            if self._closing:
                raise StoreClosed("the store is closing and accepts no more writes")
            # One batch is always accepted into an empty queue, however large, so that it can make progress.
            if self._pending and self._pending_bytes + nbytes > self._max_pending_bytes:
                raise Saturated(
                    f"ingest queue is full ({self._pending_bytes} bytes waiting to be written); retry shortly"
                )
            self._pending.append(_Pending(batch, nbytes, done, dedup))
            self._pending_bytes += nbytes
            self._wake.notify()
        return done

    def close(self) -> None:
        """Write what is pending, then stop the writer thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closing:
                    self._wake.wait()
                group, self._pending = self._pending, []
                self._pending_bytes = 0
                if not group and self._closing:
                    return
            # A caller that gave up (its HTTP client went away) cancelled its future: its rows are not
            # written, and the others' futures can no longer be cancelled once marked running.
            self._commit_group([item for item in group if item.done.set_running_or_notify_cancel()])

    def _commit_group(self, group: list[_Pending]) -> None:
        try:
            self._write(group)
        except Exception as exc:
            if len(group) == 1:
                log.error("store write failed: %s", exc)
                group[0].done.set_exception(exc)
                return
            # One bad batch must not fail its neighbours: write each on its own to find it.
            for item in group:
                self._commit_group([item])
            return
        for item in group:
            item.done.set_result(None)

    def _write(self, group: list[_Pending]) -> None:
        parts: dict[tuple[bool, str], list[pa.Table]] = {}
        for item in group:
            for name, table in item.batch.items():
                if table.num_rows:
                    parts.setdefault((item.dedup, name), []).append(table)
        if not parts:
            return
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            for dedup in (True, False):
                tables = {
                    name: pa.concat_tables(pieces, promote_options="default")
                    for (with_dedup, name), pieces in parts.items()
                    if with_dedup == dedup
                }
                if tables:
                    self._insert(con, tables, dedup=dedup)
            con.execute("COMMIT")
            self.commits += 1
        except Exception:
            # A failed COMMIT has already ended the transaction; only roll back one that is still open.
            with contextlib.suppress(duckdb.TransactionException):
                con.execute("ROLLBACK")
            raise
