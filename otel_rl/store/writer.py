"""The store's single writer: group commit of Arrow batches into DuckDB, durable before callers hear back."""

import contextlib
import logging
import threading
import time
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
# After a write fails for lack of space (or another I/O error), writes are refused at once for this long,
# then the next group is tried again: a full disk costs one failed commit a second, not one per request.
RETRY_AFTER_S = 1.0
# DuckDB 2.0.1's words for a COMMIT whose WAL write was synced but whose automatic checkpoint then failed:
# the rows are on disk, but the database is invalidated until it is reopened.
_DURABLE_BUT_CHECKPOINT_FAILED = "COMMIT succeeded and is durable"


class Saturated(RuntimeError):
    """The write queue is full (HTTP 429, gRPC RESOURCE_EXHAUSTED): retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreUnavailable(RuntimeError):
    """The store cannot write now: a full disk or an I/O error (HTTP 503 + Retry-After, gRPC UNAVAILABLE).

    Nothing of the refused write was stored; the same write succeeds once the cause is gone."""

    def __init__(self, message: str, retry_after: float = RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreClosed(StoreUnavailable):
    """The store is shutting down and takes no more writes (HTTP 503, gRPC UNAVAILABLE)."""


def is_storage_failure(exc: BaseException) -> bool:
    """Whether a write failed for the storage's sake (space, I/O, an invalidated database), not the data's."""
    if isinstance(exc, StoreUnavailable | OSError | duckdb.IOException | duckdb.FatalException):
        return True
    text = str(exc)
    return isinstance(exc, duckdb.Error) and (
        "Could not write file" in text or "No space left on device" in text or "invalidated" in text
    )


@dataclass
class _Pending:
    batch: Batch
    nbytes: int
    done: Future
    dedup: bool


class GroupCommitWriter:
    """Takes every batch pending, inserts one Arrow table per raw table, commits once, then resolves all.

    `insert(con, {table_name: arrow_table}, dedup=..., commit_seq=...)` does the inserts (with their dedup,
    for batches submitted with it); the writer owns transactions and numbers them: every row a commit writes
    carries its `commit_seq`, one more than the last commit's, and `on_commit(commit_seq)` hears of each.
    DuckDB writes and syncs its WAL on COMMIT, so a resolved future means the rows are on disk.

    A write that fails for the storage's sake fails its group with `StoreUnavailable`, and for RETRY_AFTER_S
    every submit is refused at once; then writes are tried again. When DuckDB has invalidated the database
    (a failed checkpoint), `reopen()` gives the writer a new connection to the store (closing the old one).
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        insert: Callable[..., None],
        *,
        max_pending_bytes: int,
        reopen: Callable[[], duckdb.DuckDBPyConnection],
        last_commit_seq: int,
        on_commit: Callable[[int], None],
    ) -> None:
        self._con = con
        self.last_commit_seq = last_commit_seq
        self._committing = threading.Lock()  # held over COMMIT and the count after it: see seen_through()
        self._on_commit = on_commit
        self._insert = insert
        self._reopen = reopen
        self._max_pending_bytes = max_pending_bytes
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._closing = False
        self._failure: str | None = None  # why writes fail, from the last failed one until one succeeds
        self._refuse_until = 0.0  # time.monotonic() until which submits are refused at once
        self._reopen_needed = False
        self.commits = 0  # transactions committed so far (each holds one or more batches)
        # Called after each commit with (seconds it took, batches in it): the server's /metrics.
        self.commit_observers: list[Callable[[float, int], None]] = []
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="otel-rl-store-writer", daemon=True)
        self._thread.start()

    def seen_through(self) -> int:
        """A commit no row a finished read has seen was written after: asked once the read ended, the last
        commit made, or the one becoming visible now (counted once its COMMIT returns)."""
        with self._committing:
            return self.last_commit_seq

    def submit(self, batch: Batch, *, dedup: bool = True) -> Future:
        """Queue a batch; the future resolves (to None) once it is committed, or fails with the error."""
        nbytes = sum(table.get_total_buffer_size() for table in batch.values())
        done: Future = Future()
        with self._wake:
            if self._closing:
                raise StoreClosed("the store is closing and accepts no more writes")
            if self._failure is not None and time.monotonic() < self._refuse_until:
                raise StoreUnavailable(self._failure)
            # One batch is always accepted into an empty queue, however large, so that it can make progress.
            if self._pending and self._pending_bytes + nbytes > self._max_pending_bytes:
                raise Saturated(
                    f"ingest queue is full ({self._pending_bytes} bytes waiting to be written); retry shortly"
                )
            self._pending.append(_Pending(batch, nbytes, done, dedup))
            self._pending_bytes += nbytes
            self._wake.notify()
        return done

    @property
    def pending_bytes(self) -> int:
        """Bytes of Arrow data queued and not yet being written."""
        return self._pending_bytes

    @property
    def failure(self) -> str | None:
        """Why writes are failing (a full disk...), until one succeeds again; None while they work."""
        return self._failure

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
        if self._failure is not None and time.monotonic() < self._refuse_until:
            self._fail(group, StoreUnavailable(self._failure))  # queued before the failure: as if refused
            return
        try:
            if self._reopen_needed:
                self._reopen_store()
            self._write(group)
        except Exception as exc:
            if is_storage_failure(exc):
                self._storage_failed(group, exc)
                return
            if len(group) == 1:
                log.error("store write failed: %s", exc)
                group[0].done.set_exception(exc)
                return
            # One bad batch must not fail its neighbours: write each on its own to find it.
            for item in group:
                self._commit_group([item])
            return
        if self._failure is not None:
            log.warning("the store writes again (after: %s)", self._failure)
            self._failure = None
        for item in group:
            item.done.set_result(None)
        if self._reopen_needed:  # committed, then invalidated: reopen now, so that reads work again
            self._try_reopen()

    def _storage_failed(self, group: list[_Pending], exc: Exception) -> None:
        """Fail the group (no splitting: its neighbours would fail alike) and refuse writes for a while."""
        if self._failure is None:  # one log line per outage, not one per refused request
            log.error("store writes fail, exports get 503 until they work again: %s", exc)
        # Clients hear the cause, not the server's paths; the log has the whole error.
        cause = "No space left on device" if "No space left on device" in str(exc) else "an I/O error"
        self._failure = f"the store cannot write now ({cause}); nothing of this write was stored, retry later"
        self._refuse_until = time.monotonic() + RETRY_AFTER_S
        if "invalidated" in str(exc):
            self._reopen_needed = True
        self._fail(group, StoreUnavailable(self._failure))
        if self._reopen_needed:
            self._try_reopen()

    def _reopen_store(self) -> None:
        try:
            self._con = self._reopen()
        except Exception as exc:
            raise StoreUnavailable(f"the store could not be reopened ({exc}); retry later") from exc
        self._reopen_needed = False
        log.warning("the store was reopened after DuckDB invalidated it")

    def _try_reopen(self) -> None:
        try:
            self._reopen_store()
        except StoreUnavailable as exc:
            log.error("%s: tried again with the next write", exc)

    @staticmethod
    def _fail(group: list[_Pending], exc: Exception) -> None:
        for item in group:
            item.done.set_exception(exc)

    def _write(self, group: list[_Pending]) -> None:
        parts: dict[tuple[bool, str], list[pa.Table]] = {}
        for item in group:
            for name, table in item.batch.items():
                if table.num_rows:
                    parts.setdefault((item.dedup, name), []).append(table)
        if not parts:
            return
        con = self._con
        started = time.perf_counter()
        commit_seq = self.last_commit_seq + 1
        con.execute("BEGIN TRANSACTION")
        try:
            for dedup in (True, False):
                tables = {
                    name: pa.concat_tables(pieces, promote_options="default")
                    for (with_dedup, name), pieces in parts.items()
                    if with_dedup == dedup
                }
                if tables:
                    self._insert(con, tables, dedup=dedup, commit_seq=commit_seq)
            with self._committing:
                try:
                    con.execute("COMMIT")
                except duckdb.Error as exc:
                    if _DURABLE_BUT_CHECKPOINT_FAILED not in str(exc):
                        raise
                    log.error("a commit is durable but the checkpoint after it failed: %s", exc)
                    self._reopen_needed = True
                self.last_commit_seq = commit_seq
            self.commits += 1
        except Exception:
            # A failed COMMIT has already ended the transaction; only roll back one that is still open.
            with contextlib.suppress(duckdb.TransactionException):
                con.execute("ROLLBACK")
            raise
        seconds = time.perf_counter() - started
        self._on_commit(commit_seq)
        for observe in self.commit_observers:
            observe(seconds, len(group))
